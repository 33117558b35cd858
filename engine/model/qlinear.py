"""4-bit weights kept as the GGUF stores them, multiplied by torch's int4 CPU kernel.

Decode on a CPU is bound by weight bytes: fp32 copies of the default model's Q4_1 weights are 540 MB a
token, their 4-bit blocks ~70 MB. Q4_0/Q4_1 blocks (32 weights, fp16 scale d and, for Q4_1, minimum m)
map exactly onto the kernel's per-group form w = (q - 8) * scale + zero with scale = d, zero = m + 8d.
The kernel is fast only with bf16 activations, so inputs, scales and zeros are rounded to bf16 (relative
error ~2e-3 per matmul) and the result comes back in the caller's dtype. Opt-in (weights="q4").

For many rows at once (prefill chunks) the kernel is slower than fp32 sgemm (~1.7x at 256 rows, measured),
and there the matmul is compute bound anyway, so prompt rows go through a dense copy: decode reads the
4-bit bytes, prefill runs at dense speed, memory holds both. Which path a row takes is decided per
sequence (prompt tokens vs generated ones, RowSplit), never by the size of the batch (a size rule made
2 of 8 greedy chats differ alone vs batched, measured). Even so q4 output is not bitwise batch-invariant:
fp32 sgemm results differ in the last bits with the row count, and the bf16 rounding of the 4-bit
kernel's inputs can amplify that (1 of 4 greedy chats still diverged within 24 tokens in one test);
dense fp32 is the mode with that guarantee.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

GROUP = 32  # GGUF Q4 block size = the kernel's group size


def q4_supported() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


class Q4Linear:
    """An (N, K) weight as 4-bit codes with per-32 scales and zeros, w = (code - 8) * scale + zero
    (engine.model.weights.q4_blocks reads them from GGUF blocks); use it through linear()."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
        N, K = codes.shape
        if K % GROUP or scale.shape != (N, K // GROUP) or zero.shape != scale.shape:
            raise ValueError(f"Q4Linear wants codes (N, K) with K % {GROUP} == 0 and (N, K/{GROUP}) scales")
        if not q4_supported():
            raise RuntimeError("this torch build has no int4 CPU matmul (_weight_int4pack_mm_for_cpu); "
                               "load the model with weights='dense'")
        self.shape = (N, K)
        self.codes = codes.to(torch.uint8)  # kept for dequantize() and cat()
        self.scale = scale.float()
        self.zero = zero.float()
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(self.codes.to(torch.int32), 1)
        self.scales_zeros = torch.stack([self.scale.t(), self.zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        self.dense = self.dequantize()  # for prefill-sized calls (see the module docstring)

    @classmethod
    def cat(cls, parts: list["Q4Linear"]) -> "Q4Linear":
        """Stack along the output dim (fused q|k|v and gate|up)."""
        return cls(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]),
                   torch.cat([p.zero for p in parts]))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        N, K = self.shape
        w = (self.codes.float() - 8).view(N, K // GROUP, GROUP) * self.scale[..., None] + self.zero[..., None]
        return w.view(N, K).to(dtype)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def nbytes(self) -> int:
        """Bytes one decode-sized call reads (the 4-bit codes and their scales)."""
        return self.packed.numel() * self.packed.element_size() + self.scales_zeros.numel() * 2

    def memory_bytes(self) -> int:
        return self.nbytes() + self.dense.numel() * self.dense.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Through the 4-bit kernel (every row independent of the others)."""
        lead = x.shape[:-1]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.shape[1]).to(torch.bfloat16), self.packed,
                                                       GROUP, self.scales_zeros)
        return y.to(x.dtype).view(*lead, self.shape[0])


class RowSplit:
    """Which rows of a step are prompt tokens (dense copy) and which generated ones (4-bit kernel)."""

    def __init__(self, prompt_rows: torch.Tensor | None, T: int):
        n = 0 if prompt_rows is None else prompt_rows.numel()
        self.all_prompt = n == T > 0
        self.prompt = prompt_rows if 0 < n < T else None
        if self.prompt is not None:
            keep = torch.ones(T, dtype=torch.bool, device=prompt_rows.device)
            keep[prompt_rows] = False
            self.generated = keep.nonzero().reshape(-1)


def linear(x: torch.Tensor, w: "torch.Tensor | Q4Linear", bias: torch.Tensor | None = None,
           rows: RowSplit | None = None) -> torch.Tensor:
    """F.linear for dense or Q4 weights; for Q4, `rows` sends prompt rows through the dense copy."""
    if not isinstance(w, Q4Linear):
        return F.linear(x, w, bias)
    if rows is None or not (rows.all_prompt or rows.prompt is not None):
        y = w(x)
    elif rows.all_prompt:
        y = F.linear(x, w.dense.to(x.dtype))
    else:
        y = x.new_empty(x.shape[0], w.shape[0])
        y.index_copy_(0, rows.prompt, F.linear(x.index_select(0, rows.prompt), w.dense.to(x.dtype)))
        y.index_copy_(0, rows.generated, w(x.index_select(0, rows.generated)))
    return y if bias is None else y + bias
