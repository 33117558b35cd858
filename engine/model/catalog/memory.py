"""Will it fit? Weights + KV cache + activations estimated from a model's headers, before anything is
allocated, so an oversized model gets a clear message (numbers and what to change) instead of an OOM kill.

The weight term follows the loader's own rules per tensor (engine.model.packing.repack: which matrices are packed,
in which kernel format, and whether a dense copy is kept), the cache term is the pools' exact size, activations are a bound for one prefill chunk. The
numbers are what this process will hold; the OS, the app and other programs need the rest.

Loading peaks at its own size, beside the resident one (`load_peak_bytes`): the loader reads the file tensor by
tensor in file order, keeping what it has built so far while the current tensor's file pages are resident.
Matrices it packs are read tile by tile, their pages dropped per tile, so they add only their packed form; a
tensor copied or converted whole (the embedding's rows, a dense tensor) has all its pages resident beside its
copy until it is done. The tokenizer, built on its own thread meanwhile, keeps ~TOKENIZER_BYTES_PER_TOKEN a
vocabulary entry (its transient build, about twice that, overlaps the first tensors; with the load's threads and
allocator arenas it adds ~LOAD_OVERHEAD_BYTES, measured on a 49,152-token vocabulary). Measured with a fresh
process's VmHWM on synthetic GGUFs (`python -m tools.models.synthetic_gguf`): within 3% of this for a 226 MB Q8_0 file
with a 151,936-token BPE vocabulary and a 72 MB Q4_K_M one; 16% under for an 8 MB one, whose fixed costs vary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...cache.budget import HEADROOM, available_bytes, kv_cache_bytes, pool_bytes
from ...contract import DEFAULT_CACHE_TOKENS, WEIGHT_ALIASES
from ..config import attention_fuses
from .info import ModelInfo, read_model_info
from ..weights import default_model_path

GiB = 1 << 30
TOKENIZER_BYTES_PER_TOKEN = 440  # kept by a built tokenizer (measured: 62 MB for 151,936 BPE tokens, 21 MB for 49,152)
LOAD_OVERHEAD_BYTES = 16 << 20  # above the parts while loading: the tokenizer's build transient, threads, arenas
RUNTIME_BYTES = 600 << 20  # torch, Python and the app themselves (measured RSS before any model: ~0.5 GB)
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ModelTooLarge(MemoryError):
    """Raised before loading when the estimate exceeds the memory available; str() says why and what to do."""

    def __init__(self, estimate: "MemoryEstimate"):
        super().__init__(estimate.message())
        self.estimate = estimate


@dataclass
class MemoryEstimate:
    weights_bytes: int
    cache_bytes: int
    activation_bytes: int
    runtime_bytes: int
    available_bytes: int | None  # free RAM (CPU) or free GPU memory; None when unknown
    device: str
    weights: str  # the weight format the estimate assumed
    cache_tokens: int
    kv_quant: str | None
    file_bytes: int
    kind: str  # "gguf" | "hf"
    load_peak_bytes: int = 0  # the most the load holds at once above the runtime (see the module docstring)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.cache_bytes + self.activation_bytes + self.runtime_bytes

    @property
    def fits(self) -> bool | None:
        if self.available_bytes is None:
            return None
        return self.total_bytes <= self.available_bytes * HEADROOM

    def summary(self) -> str:
        """One line: the parts and the total (and what is free)."""
        free = "" if self.available_bytes is None else f" of {_gib(self.available_bytes)} free"
        return (f"needs ~{_gib(self.total_bytes)}{free} on {self.device}: weights {_gib(self.weights_bytes)} "
                f"({self.weights}), KV cache {_gib(self.cache_bytes)} ({self.cache_tokens:,} tokens, "
                f"{self.kv_quant or 'unquantized'}), activations {_gib(self.activation_bytes)}, "
                f"runtime {_gib(self.runtime_bytes)}"
                + (f"; loading peaks at ~{_gib(self.load_peak_bytes)} (weights as built, file pages in use, "
                   f"tokenizer)" if self.load_peak_bytes else ""))

    def suggestion(self) -> str:
        """What would make it fit, biggest lever first."""
        tips = []
        if self.weights_bytes > 1.5 * self.file_bytes and self.kind == "gguf":
            tips.append("keep the GGUF's weights quantized (weights='auto')")
        elif self.kind == "hf" and self.weights != "q8":
            tips.append("quantize the weights at load (weights='q8'), or use a Q4_K_M GGUF of this model")
        if self.available_bytes is not None:
            over = self.total_bytes - self.available_bytes * HEADROOM
            if self.cache_bytes > 0 and over < self.cache_bytes:
                per_token = self.cache_bytes / max(self.cache_tokens, 1)
                fit_tokens = int((self.cache_bytes - over) / per_token) // 256 * 256
                if fit_tokens >= 256:
                    tips.append(f"a smaller cache ({fit_tokens:,} tokens or fewer)")
        if self.kv_quant is None and self.cache_bytes > GiB // 4:
            tips.append("a quantized KV cache (q8 halves it, q4 quarters it)")
        if self.kind == "gguf":
            tips.append("a smaller quantization of this model (e.g. Q4_K_M or Q3_K_M)")
        tips.append("a smaller model")
        return "Try " + "; or ".join(tips) + "."

    def message(self) -> str:
        return f"This model will not fit: it {self.summary()}. {self.suggestion()}"


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / (1 << 20):.0f} MiB"


def resolve_weights(weights: str, kind: str, device: str = "cpu") -> str:
    """The format Model.load will actually use: auto keeps a GGUF's quantized matrices packed on a CPU."""
    if weights == "auto":
        return "packed" if kind == "gguf" and device == "cpu" else "dense"
    return WEIGHT_ALIASES.get(weights, weights)


def estimate_memory(source: str | Path | ModelInfo | None, cache_tokens: int = DEFAULT_CACHE_TOKENS,
                    kv_quant: str | None = None, weights: str = "auto", device: str = "cpu", dtype: str | None = None,
                    chunk_tokens: int | None = None) -> MemoryEstimate:
    """Estimate from headers only (see the module docstring); `source` may be a path, a ModelInfo or None
    (the default model)."""
    from .. import qlinear

    if source is None:
        source = default_model_path()
    info = source if isinstance(source, ModelInfo) else read_model_info(source)
    if info.config is None:
        raise ValueError(f"{info.path}: {info.problem or 'not a model this engine reads'}")
    c = info.config
    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    elt = _DTYPE_BYTES[dtype]
    fmt = resolve_weights(weights, info.kind, device)
    parts = _weight_parts(info, fmt, elt, device)
    weight_bytes = sum(kept for kept, _ in parts)
    # the pools' own element type (fp16 under packed weights on a CPU: Model.kv_pool_dtype), not the weights'
    cache = kv_cache_bytes(c, cache_tokens, kv_quant, pool_bytes(device.split(":")[0], dtype, fmt, attention_fuses(c)))
    chunk = chunk_tokens or (2048 if device.startswith("cuda") else 256)
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    layer = chunk * (6 * c.hidden_size + 2 * qkv + 3 * c.intermediate_size) * 4  # one layer's fp32 temporaries
    context = min(cache_tokens, c.max_seq_len)
    scores = chunk * context * (c.num_heads if c.attn_softcap else 1) * 4  # masks; explicit scores when soft-capped
    logits = 64 * c.vocab_size * 4
    tile = qlinear.TILE_ROWS * max(c.hidden_size, c.intermediate_size) * 4 if fmt != "dense" else 0
    runtime = RUNTIME_BYTES if not device.startswith("cuda") else 700 << 20
    return MemoryEstimate(weight_bytes, cache, layer + scores + logits + tile, runtime, available_bytes(device), device,
                          fmt, cache_tokens, kv_quant, info.file_bytes, info.kind,
                          _load_peak(parts) + TOKENIZER_BYTES_PER_TOKEN * c.vocab_size + LOAD_OVERHEAD_BYTES)


def estimate_download(file_bytes: int, kind: str = "gguf", device: str = "cpu") -> MemoryEstimate:
    """The estimate for a model not on disk yet, from its download size alone: weights as the loader keeps them
    (a GGUF's blocks stay packed, about the file's size; an HF folder's 16-bit tensors widen to float32 on a
    CPU), the runtime, and no KV cache or activations (they need the model's shape, which only the file's
    header gives: estimate_memory once it is downloaded). So "does not fit" is certain, "fits" is a floor."""
    if file_bytes < 0 or kind not in ("gguf", "hf"):
        raise ValueError(f"estimate_download needs a size >= 0 and kind 'gguf' or 'hf', got {file_bytes}, {kind!r}")
    widen = 2 if kind == "hf" and not device.startswith("cuda") else 1
    runtime = RUNTIME_BYTES if not device.startswith("cuda") else 700 << 20
    return MemoryEstimate(file_bytes * widen, 0, 0, runtime, available_bytes(device), device,
                          resolve_weights("auto", kind, device), 0, None, file_bytes, kind)


def weights_bytes(info: ModelInfo, fmt: str, elt: int = 4, device: str = "cpu") -> int:
    """Bytes the loaded weights hold in format `fmt` (dense ones `elt` bytes a weight) on `device`: the loader's
    rules per tensor (engine.model.packing.repack), so it equals Model.memory_bytes() after loading."""
    return sum(kept for kept, _ in _weight_parts(info, fmt, elt, device))


def _load_peak(parts: list[tuple[int, int]]) -> int:
    """The most the weights' load holds at once: what is built so far plus the current tensor's file pages."""
    built = peak = 0
    for kept, pages in parts:
        built += kept
        peak = max(peak, built + pages)
    return peak


def _weight_parts(info: ModelInfo, fmt: str, elt: int = 4, device: str = "cpu") -> list[tuple[int, int]]:
    """Per tensor in file order: (bytes kept once loaded, file bytes resident beside them while it loads); on a
    CPU the decoder layers' Q4_0 and Q5_0 matrices, once grouped, leave their minimums out."""
    import kernels
    from kernels.formats import GROUP
    from kernels.packed import SCALE_PAD

    from ..packing import experts, repack

    c = info.config
    packed = {t.name: t for t in info.tensors if repack.keeps_packed(t.name, t.dtype, len(t.shape), fmt)}
    dense_copy = repack.keeps_dense_copy(sum(t.numel for t in packed.values()))
    own = repack.mixed_parts_kept(dense_copy)
    packed_types = {n: t.dtype for n, t in packed.items()}
    kernels_of = repack.kernel_formats(packed_types, fmt, own)
    copies = repack.copied(packed_types, kernels_of) if dense_copy else set()
    names = {t.name for t in info.tensors}
    rows = {t.name: int(t.shape[0]) for t in info.tensors}
    tied = c.tie_word_embeddings or not names & {"output.weight", "lm_head.weight"}
    head = "token_embd.weight" if "token_embd.weight" in names else "model.embed_tokens.weight"
    if not tied:
        head = "output.weight" if "output.weight" in names else "lm_head.weight"
    parts: list[tuple[int, int]] = []
    for t in info.tensors:
        total = 0
        if not _used(t.name) or (tied and t.name in ("output.weight", "lm_head.weight")):
            continue  # tied: the loader drops a stored head
        table = repack.gguf_table(t.name, tied, bool(packed)) if info.kind == "gguf" else None
        streamed = False  # packed from the file tile by tile, each tile's pages dropped once read
        if table == "rows":  # the file's own blocks (engine.model.embedding)
            total += t.nbytes
        elif table == "head" or t.name in packed:
            kernel = kernels_of.get(t.name) or repack.kernel_format(t.dtype, fmt)
            copy = t.name in copies or (dense_copy and t.name not in packed  # a dense head packed as q8
                                        and (repack.dense_copy_forced() or not repack.decodes_exactly(t.dtype, kernel)))
            total += experts.storage_bytes(kernel, t.shape) + (4 * t.numel if copy else 0)  # per expert of a stack
            streamed = info.kind == "gguf"
            joined = repack.fused_into(t.name, packed, kernels_of if own else None) and not c.fused_projections
            if joined:
                total -= experts.matrices(t.shape) * repack.scale_buffers(kernel) * 2 * SCALE_PAD  # one per fused matrix
            if not device.startswith("cuda") and repack.minimums_left_out(t.name, packed_types, rows, kernels_of,
                                                                          own):
                total -= t.numel // GROUP * 2 + (0 if joined else 2 * SCALE_PAD)  # the minimums' buffer, freed
        elif t.name == head and not packed:  # a dense head is padded to the kernels' vocabulary multiple
            total += kernels.pad_vocab(t.shape[0]) * t.numel // t.shape[0] * elt
        else:
            total += t.numel * elt
        parts.append((total, 0 if streamed else t.nbytes))
    return parts


def check_fits(source: str | Path | ModelInfo | None, **kwargs) -> MemoryEstimate:
    """estimate_memory(), raising ModelTooLarge when it will not fit (unknown free memory passes)."""
    est = estimate_memory(source, **kwargs)
    if est.fits is False:
        raise ModelTooLarge(est)
    return est


def _used(name: str) -> bool:
    """Tensors the model keeps (rope factor tables are folded into the config; vision towers are dropped)."""
    return not name.startswith(("rope_", "vision_tower", "multi_modal_projector", "model.vision_tower",
                                "model.multi_modal_projector"))
