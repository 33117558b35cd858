"""Packed (quantized) linear weights: one interface, one kernel per format.

Decode on a CPU is bound by weight bytes: fp32 copies of the default model's Q4_1 layers are 540 MB a
token, their 4-bit blocks ~70 MB. Formats, all in blocks of 32 weights along K with fp16 scales:
- "q4": w = d * q + m, q in 0..15 (GGUF Q4_1; Q4_0 is m = -8d), kept exactly as the GGUF stores it.
- "q8": w = d * q, q int8 (GGUF Q8_0), or any dense weight quantized at load (weights="q8", symmetric,
  d = max|w| / 127 per block).
The kernel (kernels.cpu_ext, built at first use) quantizes each activation row to int8 per block and
multiplies with integer dot products, as llama.cpp does; every output element is computed the same way
whatever the row count, so a row's result never depends on the batch. Without that extension q4 falls back
to torch's int4 kernel (bf16 activations) and q8 to the dense copy.

Prompt rows of prefill chunks (>= DENSE_MIN_ROWS tokens of one sequence) go through a dense copy instead
(RowSplit): there the matmul is compute bound and fp32 sgemm is faster than the integer kernels (~2x at 256
rows, measured), and such a prompt's logits stay the dense model's. Tiny chunks (a prompt prefilled a few
tokens a step beside decoding chats, engine.generator.step_budget) stay packed: the dense copy would read 8x the
bytes. Which path a row takes is decided per sequence, never by the size of the batch. Memory holds both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels
from kernels import cpu_ext

GROUP = 32  # GGUF block size = the kernels' group size
ACTIVATIONS = {None: 0, "swiglu": 1}  # fused epilogues of the kernel: silu(gate) * up for [gate | up] rows
# A sequence's prompt chunk this long or longer takes the dense copy: whole chat prompts stay exact (packed
# prefill of a 37-token chat prompt flipped the default model's first answer token, measured), while the few
# tokens a step prefills beside decoding chats (engine.generator.step_budget) stay packed.
DENSE_MIN_ROWS = 16
SCALE_PAD = 8  # the kernels load 8 fp16 scales at a time, so scale tensors carry 8 more values of storage


def _scales(t: torch.Tensor) -> torch.Tensor:
    """fp16 copy of (N, K/32) scales in a buffer SCALE_PAD values longer (zeros)."""
    buf = torch.zeros(t.numel() + SCALE_PAD, dtype=torch.float16)
    buf[: t.numel()] = t.reshape(-1)
    return buf[: t.numel()].view(t.shape)


def q4_supported() -> bool:
    """Whether a q4 matmul exists here: pagedeck's kernel, or torch's int4 CPU kernel as the fallback."""
    return cpu_ext.available() or hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class PackedLinear:
    """An (N, K) weight in a packed format; use it through linear(). Subclasses own the layout.

    The contract a new format (e.g. a GGUF K-quant) fills in:
    - `format`: its name (Model.weight_format, the bench's JSON); `shape`; `dense`: an fp32 (N, K) copy for
      prompt rows, or None (then every row takes the packed path).
    - `dequantize(dtype)` -> (N, K): the exact weight the blocks encode (tests compare kernels against it).
    - `_packed()`: the tensors a decode-sized call reads (nbytes(), decode_bytes(), the roofline).
    - `_kernel_args()` -> (qs, d, m) for torch.ops.pagedeck.qmatmul(x, qs, d, m, act), kernels/cpu/qmatmul.cpp:
      per 32 weights along K an fp16 scale d (and for q4 an fp16 minimum m), both (N, K/32) made by
      _scales() (SCALE_PAD values of storage after them); qs uint8 rows: q4 = (N, K/2) GGUF nibble order
      (w = d * code + m), q8 = (N, K) code + 128 with m None (w = d * code). A format the kernel cannot
      read either repacks to one of these at load (exact when its blocks are finer, e.g. K-quant
      sub-blocks of 32 whose scales are products: d = super_scale * sub_scale rounded to fp16 is not exact,
      so check dequantize() against the GGUF) or overrides __call__.
    - `_fallback(x)`: the product without the extension (default: the dense copy).
    - `cat(parts)` (classmethod): stacked along N, for the fused qkv and gate|up weights (cat_packed).
    Rows are independent: a row's output never depends on the other rows of the call (batch invariance)."""

    format = ""

    def __init__(self, shape: tuple[int, int], dense: torch.Tensor | None):
        self.shape = shape
        self.dense = dense  # fp32 copy for prompt rows (see the module docstring)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        raise NotImplementedError

    def _packed(self) -> list[torch.Tensor]:
        """The tensors a decode-sized call reads."""
        raise NotImplementedError

    def _kernel_args(self) -> tuple:
        """(qs, d, m) for torch.ops.pagedeck.qmatmul: see the class docstring."""
        raise NotImplementedError

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dense.to(x.dtype))

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def nbytes(self) -> int:
        """Bytes one decode-sized call reads (the packed blocks and their scales)."""
        return sum(t.numel() * t.element_size() for t in self._packed())

    def memory_bytes(self) -> int:
        return self.nbytes() + (0 if self.dense is None else self.dense.numel() * self.dense.element_size())

    def __call__(self, x: torch.Tensor, act: str | None = None) -> torch.Tensor:
        """x (..., K) -> (..., N), or (..., N/2) with act="swiglu"; every row independent of the others."""
        ops = cpu_ext.ops() if x.device.type == "cpu" and x.dtype == torch.float32 else None
        if ops is not None and x.dim() == 2:  # the decode path: keep it lean, it runs ~120 times a step
            return ops.qmatmul(x.contiguous(), *self._kernel_args(), ACTIVATIONS[act])
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.shape[1])
        if ops is not None:
            y = ops.qmatmul(x2.contiguous(), *self._kernel_args(), ACTIVATIONS[act])
        else:
            y = self._fallback(x2)
            if act == "swiglu":
                y = kernels.silu_mul(y)
        return y.view(*lead, y.shape[-1])


def _check_blocks(N: int, K: int, scale: torch.Tensor) -> None:
    if K % GROUP or scale.shape != (N, K // GROUP):
        raise ValueError(f"packed weights want (N, K) with K % {GROUP} == 0 and (N, K/{GROUP}) scales, "
                         f"got ({N}, {K}) and {tuple(scale.shape)}")


class Q4Linear(PackedLinear):
    """4-bit codes with fp16 scale and minimum per 32: w = code * scale + minimum (engine.model.weights.q4_blocks
    reads them from GGUF Q4_0/Q4_1 blocks without rounding)."""

    format = "q4"

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor):
        N, K = codes.shape
        _check_blocks(N, K, scale)
        if minimum.shape != scale.shape:
            raise ValueError(f"minimum {tuple(minimum.shape)} must match scale {tuple(scale.shape)}")
        if not q4_supported():
            raise RuntimeError("no 4-bit matmul here (pagedeck's CPU kernels did not build and this torch has no "
                               "_weight_int4pack_mm_for_cpu); load the model with weights='dense'")
        c = codes.to(torch.uint8).reshape(N, K // GROUP, 2, 16)
        self.qs = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(N, K // 2).contiguous()  # GGUF nibble order
        self.scale = _scales(scale)
        self.minimum = _scales(minimum)
        self._int4 = None  # torch's packing, built only if the fallback runs
        super().__init__((N, K), None)
        self.dense = self.dequantize()

    def codes(self) -> torch.Tensor:
        N, K = self.shape
        b = self.qs.view(N, K // GROUP, 1, 16)
        return torch.cat([b & 0xF, b >> 4], dim=2).reshape(N, K)

    @classmethod
    def cat(cls, parts: list["Q4Linear"]) -> "Q4Linear":
        """Stack along the output dim (fused q|k|v and gate|up)."""
        return cls(torch.cat([p.codes() for p in parts]), torch.cat([p.scale for p in parts]),
                   torch.cat([p.minimum for p in parts]))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        N, K = self.shape
        w = self.codes().float().view(N, K // GROUP, GROUP) * self.scale.float()[..., None] + self.minimum.float()[..., None]
        return w.view(N, K).to(dtype)

    def _packed(self) -> list[torch.Tensor]:
        return [self.qs, self.scale, self.minimum]

    def _kernel_args(self) -> tuple:
        return self.qs, self.scale, self.minimum

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") or x.device.type != "cpu":
            return super()._fallback(x)
        if self._int4 is None:  # torch's form: w = (code - 8) * scale + zero, bf16 scales and zeros
            zero = self.minimum.float() + 8 * self.scale.float()
            self._int4 = (torch.ops.aten._convert_weight_to_int4pack_for_cpu(self.codes().to(torch.int32), 1),
                          torch.stack([self.scale.float().t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous())
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self._int4[0], GROUP, self._int4[1])
        return y.to(x.dtype)


class Q8Linear(PackedLinear):
    """int8 codes with an fp16 scale per 32: w = code * scale (GGUF Q8_0, or quantize() of a dense weight);
    kept as u8 code + 128 for the kernel."""

    format = "q8"

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dense: torch.Tensor | None = None):
        N, K = codes.shape
        _check_blocks(N, K, scale)
        if codes.dtype != torch.int8:
            raise ValueError(f"Q8Linear codes must be int8, got {codes.dtype}")
        self.qs = (codes.to(torch.int16) + 128).to(torch.uint8)  # the kernel multiplies u8 by s8
        self.scale = _scales(scale)
        super().__init__((N, K), None)
        self.dense = dense if dense is not None else self.dequantize()

    @classmethod
    def quantize(cls, w: torch.Tensor, keep_dense: bool = True) -> "Q8Linear":
        """Symmetric per-32 int8 (GGUF Q8_0's rule); a Q8_0 weight dequantized to fp32 comes back unchanged."""
        N, K = w.shape
        if K % GROUP:
            raise ValueError(f"q8 packing needs K % {GROUP} == 0, got {tuple(w.shape)}")
        blocks = w.detach().float().reshape(N, K // GROUP, GROUP)
        scale = (blocks.abs().amax(-1) / 127).to(torch.float16)
        inv = torch.where(scale > 0, 1 / scale.float(), torch.zeros(()))
        codes = (blocks * inv[..., None]).round().clamp(-127, 127).to(torch.int8).reshape(N, K)
        return cls(codes, scale, w.float() if keep_dense else None)

    @classmethod
    def cat(cls, parts: list["Q8Linear"]) -> "Q8Linear":
        return cls(torch.cat([p.codes() for p in parts]), torch.cat([p.scale for p in parts]),
                   torch.cat([p.dense for p in parts]) if all(p.dense is not None for p in parts) else None)

    def codes(self) -> torch.Tensor:
        return (self.qs.to(torch.int16) - 128).to(torch.int8)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        N, K = self.shape
        w = self.codes().float().view(N, K // GROUP, GROUP) * self.scale.float()[..., None]
        return w.view(N, K).to(dtype)

    def _packed(self) -> list[torch.Tensor]:
        return [self.qs, self.scale]

    def _kernel_args(self) -> tuple:
        return self.qs, self.scale, None

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, (self.dense if self.dense is not None else self.dequantize()).to(x.dtype))


def cat_packed(parts: list[PackedLinear]) -> PackedLinear:
    """Stack packed weights of one format along the output dim."""
    kinds = {type(p) for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"cannot fuse packed weights of different formats: {sorted(p.format for p in parts)}")
    return kinds.pop().cat(parts)


class RowSplit:
    """Which rows of a step take the dense copy (`prompt_rows`: prompt tokens) and which the packed kernel."""

    def __init__(self, prompt_rows: torch.Tensor | None, T: int):
        self.prompt_rows = prompt_rows
        n = 0 if prompt_rows is None else prompt_rows.numel()
        self.all_prompt = n == T > 0
        self.prompt = prompt_rows if 0 < n < T else None
        if self.prompt is not None:
            keep = torch.ones(T, dtype=torch.bool, device=prompt_rows.device)
            keep[prompt_rows] = False
            self.generated = keep.nonzero().reshape(-1)

    @classmethod
    def of_batch(cls, prompt_rows: torch.Tensor | None, cu_q: torch.Tensor, min_rows: int = DENSE_MIN_ROWS) -> "RowSplit":
        """The prompt rows of sequences that feed at least min_rows tokens in this step (cu_q: (B+1,) offsets)."""
        T = int(cu_q[-1])
        if prompt_rows is None or prompt_rows.numel() == 0:
            return cls(None, T)
        lengths = cu_q[1:] - cu_q[:-1]
        seq = torch.searchsorted(cu_q[1:].to(prompt_rows.dtype), prompt_rows, right=True)
        return cls(prompt_rows[lengths[seq] >= min_rows], T)

    @classmethod
    def of_rows(cls, prompt_rows: torch.Tensor | None, T: int, rows: torch.Tensor) -> "RowSplit":
        """The split of x[rows] (e.g. the logit rows) given the prompt rows of x."""
        if prompt_rows is None or prompt_rows.numel() == 0:
            return cls(None, rows.numel())
        is_prompt = torch.zeros(T, dtype=torch.bool, device=rows.device)
        is_prompt[prompt_rows] = True
        return cls(is_prompt[rows].nonzero().reshape(-1), rows.numel())


def _act(y: torch.Tensor, act: str | None) -> torch.Tensor:
    return kernels.silu_mul(y) if act == "swiglu" else y


def linear(x: torch.Tensor, w: "torch.Tensor | PackedLinear", bias: torch.Tensor | None = None,
           rows: RowSplit | None = None, act: str | None = None) -> torch.Tensor:
    """F.linear for dense or packed weights (act="swiglu": silu(gate) * up of a [gate | up] weight); for
    packed weights, `rows` sends prompt rows through the dense copy. A generated row takes the same path
    whatever else is in the step."""
    if not isinstance(w, PackedLinear):
        return _act(F.linear(x, w, bias), act)

    def packed(v: torch.Tensor) -> torch.Tensor:  # the kernel's epilogue only applies without a bias
        return w(v, act) if bias is None else _act(w(v) + bias, act)

    if w.dense is None or rows is None or not (rows.all_prompt or rows.prompt is not None):
        return packed(x)
    dense = w.dense.to(x.dtype)
    if rows.all_prompt:
        return _act(F.linear(x, dense, bias), act)
    y = x.new_empty(x.shape[0], w.shape[0] // 2 if act == "swiglu" else w.shape[0])
    y.index_copy_(0, rows.prompt, _act(F.linear(x.index_select(0, rows.prompt), dense, bias), act))
    y.index_copy_(0, rows.generated, packed(x.index_select(0, rows.generated)))
    return y
