"""pagedeck's compute kernels behind one interface, dispatched by device: CUDA tensors go to Triton; CPU
tensors go to the torch reference (kernels/reference*.py), or to pagedeck's own C++ kernels (kernels/cpu/,
built at first use by kernels.cpu_ext) for the ops that have one, where they are built: rms_norm(fast=True),
fused_attention and decode_layers (C++ only), and kernels.packed.qmatmul (packed weights, their layouts).

The Triton modules are imported lazily, on the first CUDA call, so the CPU engine (and platforms without
Triton) never import triton."""

from __future__ import annotations

import torch

from . import cpu_ext as _cpu_ext
from . import packed
from . import reference_attention as _attention
from . import reference as _ref
from . import reference_lora as _lora
from .kv_quant import FORMATS as KV_QUANT_FORMATS
from .kv_quant import QuantizedPool, copy_page_prefix, copy_pages, make_pool, permute_pages, pool_nbytes
from .reference_lora import LoRAPlan, lora_plan
from .vocab import pad_embedding, pad_vocab

__all__ = [
    "rms_norm", "apply_rotary", "silu_mul", "gelu_tanh_mul", "write_kv", "paged_attention",
    "QuantizedPool", "make_pool", "copy_pages", "copy_page_prefix", "permute_pages", "pool_nbytes",
    "KV_QUANT_FORMATS",
    "pad_vocab", "pad_embedding", "use_triton", "plan_step", "StepPlan", "fused_attention", "decode_layers",
    "dequant_matmul", "packed", "lora_plan", "LoRAPlan", "lora_shrink", "lora_expand",
]

_triton_ops = None


def use_triton(t: torch.Tensor) -> bool:
    """The one dispatch rule: CUDA tensors go to Triton."""
    return t.is_cuda


def _triton():
    global _triton_ops
    if _triton_ops is None:
        from . import triton_ops

        _triton_ops = triton_ops
    return _triton_ops


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, fast: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual); without residual, (norm(x), x).

    fast=True on a CPU: pagedeck's fused kernel where it is built (not bit-identical to the reference)."""
    if use_triton(x):
        return _triton().rms_norm(x, weight, eps, residual)
    if fast and x.dtype == torch.float32 and x.is_contiguous():
        ops = _cpu_ext.ops()
        if ops is not None:
            return ops.rms_norm(x, weight, eps, residual)
    return _ref.rms_norm(x, weight, eps, residual)


def router_logits(h: torch.Tensor, router: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """h @ router^T (+ bias): a sparse layer's router logits. On a CPU where pagedeck's kernels are built each
    logit is summed in one fixed order (kernels/cpu/moe.cpp), so a row's experts never depend on the batch
    (torch's sgemm rounds by the row count and a near-tie then picks another expert); elsewhere torch's."""
    if h.device.type == "cpu" and h.dtype == router.dtype == torch.float32:
        ops = _cpu_ext.ops()
        if ops is not None:
            return ops.router_logits(h.contiguous(), router.contiguous(), bias)
    return torch.nn.functional.linear(h, router, bias)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                 plan: "StepPlan | None" = None, attention_factor: float = 1.0) -> None:
    """Rotary embedding in place (HF rotate_half convention) at per-token absolute positions; cos and
    sin are multiplied by `attention_factor` (LongRoPE). q/k may be views of each head's first dims."""
    if use_triton(q):
        return _triton().apply_rotary(q, k, positions, inv_freq, attention_factor)
    tables = plan.rotary_tables(inv_freq, attention_factor) if plan is not None else None
    return _ref.apply_rotary(q, k, positions, inv_freq, tables, attention_factor)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up (T, 2I) = [gate | up] -> (T, I)."""
    if use_triton(gate_up):
        return _triton().silu_mul(gate_up)
    return _ref.silu_mul(gate_up)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up for gate_up (T, 2I) = [gate | up] -> (T, I) (GeGLU, Gemma)."""
    if use_triton(gate_up):
        return _triton().gelu_tanh_mul(gate_up)
    return _ref.gelu_tanh_mul(gate_up)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Write K/V (T, Hkv, D) into slots page * page_size + offset of a tensor pool or a QuantizedPool."""
    if use_triton(k):
        return _triton().write_kv(k, v, k_cache, v_cache, slot_mapping)
    return _ref.write_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor, k_cache, v_cache, block_table: torch.Tensor, cu_q: torch.Tensor,
    kv_lens: torch.Tensor, scale: float, plan: "StepPlan | None" = None, window: int | None = None,
    softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal attention through the page table (decode, chunked prefill, verification).

    `plan` (from plan_step) carries the layer-independent indexing of the torch path; Triton derives it
    on the device inside the kernel, so its plan holds nothing. `window`: a sliding-window layer sees only
    the last `window` positions (itself included); `softcap`: scores become softcap * tanh(s / softcap);
    `sinks` (Hq,): one more logit per head in the softmax's denominator, with no value (gpt-oss)."""
    if use_triton(q):
        return _triton().paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale, window, softcap,
                                         sinks)
    return _attention.paged_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale,
                                      plan.attention if plan is not None else None, window, softcap, sinks)


def dequant_matmul(x: torch.Tensor, raw: torch.Tensor, qtype: int, shape: tuple[int, int]) -> torch.Tensor:
    """x (M, K) @ W.T for W (N, K) stored as GGUF blocks `raw` (N, bytes per row) of ggml type `qtype`:
    the decode GEMV for a few rows, the tiled GEMM for prefill (Triton); the gguf reference elsewhere."""
    if use_triton(x):
        from . import triton_dequant

        if x.shape[0] <= 16:
            return triton_dequant.dequant_gemv(x, raw, qtype, shape)
        return triton_dequant.dequant_gemm(x, raw, qtype, shape)
    return _ref.dequant_matmul_reference(x, raw, qtype, shape)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, plan: LoRAPlan) -> torch.Tensor:
    """Per-row LoRA shrink (T, R): row t keeps the columns of its segment's adapters, times their scales.

    a (in, R) stacks the step's adapters' A matrices; plan (from lora_plan) says which rows form which
    segment and what scale each segment gives each column (see kernels/reference_lora.py)."""
    if use_triton(x):
        return _triton().lora_shrink(x, a, plan)
    return _lora.lora_shrink(x, a, plan)


def lora_expand(s: torch.Tensor, b: torch.Tensor, y: torch.Tensor, plan: LoRAPlan, col0: int = 0) -> None:
    """y += s @ b in place, for s = columns col0.. of lora_shrink's output (y may be a column slice)."""
    if use_triton(y):
        return _triton().lora_expand(s, b, y, plan, col0)
    return _lora.lora_expand(s, b, y, plan, col0)


class StepPlan:
    """Per-forward precomputation shared by all layers: rotary tables and the attention plan (torch path).

    Rotary tables are made on first use per (inv_freq, attention_factor): models whose sliding-window
    layers use another rope base (Gemma 3) get one table per base, still once per step. fused: this step
    runs fused_attention (CPU kernels built), which attends every chunk itself (no attention plan), so a row's
    bits never depend on how its prompt was chunked; short: every chunk is decode-sized (<= SHORT_Q rows)."""

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, block_table: torch.Tensor,
                 cu_q: torch.Tensor, kv_lens: torch.Tensor, page_size: int, fuse: bool = False):
        self.positions = positions
        self._tables: dict = {}
        self.rotary = None
        self.attention = None
        self.fused = False
        self.short = False
        if not use_triton(positions):
            self.rotary = self.rotary_tables(inv_freq)
            self.fused = fuse and positions.dtype == torch.int64 and _cpu_ext.available()
            cu = cu_q.tolist()
            self.short = max(b - a for a, b in zip(cu, cu[1:])) <= _attention.SHORT_Q
            if not self.fused:
                self.attention = _attention.AttentionPlan(block_table, cu_q, kv_lens, page_size)

    def rotary_tables(self, inv_freq: torch.Tensor, attention_factor: float = 1.0):
        key = (inv_freq.data_ptr(), inv_freq.numel(), attention_factor)
        if key not in self._tables:
            self._tables[key] = _ref.rotary_tables(self.positions, inv_freq, attention_factor)
        return self._tables[key]


def plan_step(positions: torch.Tensor, inv_freq: torch.Tensor, block_table: torch.Tensor, cu_q: torch.Tensor,
              kv_lens: torch.Tensor, page_size: int, fuse: bool = False) -> StepPlan:
    """Build once per forward, pass to apply_rotary and paged_attention of every layer; fuse=True asks
    for fused_attention where this step allows it (plan.fused says whether it does)."""
    return StepPlan(positions, inv_freq, block_table, cu_q, kv_lens, page_size, fuse)


def fused_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                    block_table: torch.Tensor, cu_q: torch.Tensor, kv_lens: torch.Tensor, num_heads: int,
                    scale: float, plan: StepPlan, sinks: torch.Tensor | None = None, *,
                    rotary: tuple[torch.Tensor, torch.Tensor] | None = None, q_norm: torch.Tensor | None = None,
                    k_norm: torch.Tensor | None = None, norm_eps: float = 0.0, window: int | None = None,
                    softcap: float | None = None, with_q: bool = False):
    """apply_rotary + write_kv + paged_attention of one layer, from the fused q|k|v rows (T, (Hq + 2 Hkv) D)
    to the attention output (T, Hq D), with with_q also the query heads as attended (T, Hq, D: normed,
    rotated): one CPU call (kernels/cpu/attention.cpp) for every chunk, prefill ones included, each row over the K/V as its
    pools store it. rotary: the layer's (cos, sin) tables from plan.rotary_tables (default plan.rotary), as
    wide as half its rotated dims; q_norm / k_norm: per-head RMSNorm weights (D,) applied before the rotation;
    window, softcap, sinks: as in paged_attention. Needs plan.fused."""
    if not plan.fused:
        raise ValueError("fused_attention needs a plan built with fuse=True that allows it (plan.fused)")
    _attention.check_layer_options(window, softcap)
    cos, sin = rotary if rotary is not None else plan.rotary
    sink_logits = None if sinks is None else sinks.float().contiguous()
    qn = None if q_norm is None else q_norm.float().contiguous()
    kn = None if k_norm is None else k_norm.float().contiguous()
    out, q = _cpu_ext.ops().attend(qkv, k_cache, v_cache, cos, sin, slot_mapping, block_table, cu_q, kv_lens,
                                   num_heads, scale, qkv.shape[0], sink_logits, qn, kn, norm_eps, window or 0,
                                   softcap or 0.0)
    return (out, q) if with_q else out


_GATES = {"swiglu": 1, "geglu": 2}  # kernels/cpu/decode.cpp's gate ids


def decode_layers(x: torch.Tensor, weights: list[torch.Tensor], parts: list[int], formats: list[int],
                  k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], slot_mapping: torch.Tensor, block_table: torch.Tensor,
                  cu_q: torch.Tensor, kv_lens: torch.Tensor, num_heads: int, scale: float, eps: float,
                  plan: StepPlan, rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                  sliding_rotary: tuple[torch.Tensor, torch.Tensor] | None = None, windows: list[int] | None = None,
                  sliding: list[int] | None = None, gate: str = "swiglu",
                  softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every decoder layer of a step whose chunks are all short, in one CPU call (kernels/cpu/decode.cpp):
    the per-layer path's kernels in the same order (same bits), without Python between them. weights: per
    layer input_norm, post_norm, the q|k|v bias, q_norm, k_norm, the attention output's and the MLP output's
    norms (Gemma's sandwich norms; each an empty tensor for none), then packed.stack_entry() of each part of
    qkv, o, gate_up, down; parts: per layer the number of parts of those four (1 but for a matrix kept in
    several formats, or in parts on a mapped file); formats: each part's kernel id (kernels.formats), in the weights'
    order. rotary: the (cos, sin) tables (default plan.rotary), sliding_rotary those of the layers whose
    `sliding` is 1 (their own base: Gemma 3); windows: each layer's sliding window (0: none; default none);
    gate: "swiglu" or "geglu"; softcap: the scores' soft cap. Returns the last layer's output and the residual
    stream (their sum is the hidden state)."""
    if not plan.fused or not plan.short:
        raise ValueError("decode_layers needs a fused plan without long prefill chunks")
    if gate not in _GATES:
        raise ValueError(f"gate must be one of {sorted(_GATES)}, got {gate!r}")
    cos, sin = rotary if rotary is not None else plan.rotary
    scos, ssin = sliding_rotary if sliding_rotary is not None else (cos, sin)
    n = len(k_caches)
    return _cpu_ext.ops().decode_layers(x, weights, k_caches, v_caches, cos, sin, scos, ssin, slot_mapping,
                                        block_table, cu_q, kv_lens, parts, formats, windows or [0] * n,
                                        sliding or [0] * n, num_heads, scale, eps, _GATES[gate], softcap or 0.0,
                                        _attention.SHORT_Q)
