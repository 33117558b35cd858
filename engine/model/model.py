"""The Llama-family decoder (Llama, Llama 3, Mistral, Qwen2, Qwen3) running over the paged K/V cache.

Weights are kept fused where it saves kernel launches (q|k|v and gate|up); everything else is the plain
transformer, so a reader can check it against the paper in one sitting.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

import kernels

from ..contract import WEIGHT_FORMATS
from .batch import Batch
from .config import ModelConfig
from .qlinear import PackedLinear, Q8Linear, RowSplit, cat_packed, linear, q4_supported
from .weights import PROJECTION_NAMES, load_weights

if TYPE_CHECKING:
    from .lora import LoRAApply


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


_NO_LORA_STATE = ("Model holds no LoRA adapters: pass lora= to forward() / forward_tokens() "
                  "(DynamicGenerator.set_loras keeps each generator's own set)")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # bf16 matmul is very slow on CPUs without AMX


class Model:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, path: Path | None = None):
        self.config = config
        self.device = device
        self.dtype = dtype
        self.path = path
        self.weight_format = "dense"
        self.name = path.name if path is not None else "model"
        c = config
        w = weights

        def get(name: str) -> torch.Tensor:
            if name not in w:
                raise ValueError(f"weights are missing tensor {name!r}")
            if isinstance(w[name], PackedLinear):
                if device.type != "cpu":
                    raise ValueError(f"weights='{w[name].format}' runs on the CPU only (CPU kernels)")
                return w[name]
            return w[name].to(device=device, dtype=dtype)

        def fused(names: list[str]) -> "torch.Tensor | PackedLinear":
            parts = [get(n) for n in names]
            if all(isinstance(p, PackedLinear) for p in parts) and len({p.format for p in parts}) == 1:
                return cat_packed(parts)
            return torch.cat([p.dequantize(dtype) if isinstance(p, PackedLinear) else p for p in parts])

        self.embed = get("model.embed_tokens.weight")
        self.vocab_size = c.vocab_size
        self.padded_vocab = kernels.pad_vocab(c.vocab_size)
        head = self.embed if c.tie_word_embeddings or "lm_head.weight" not in w else get("lm_head.weight")
        self.lm_head = kernels.pad_embedding(head)
        self.norm = get("model.norm.weight")
        formats = {t.format for t in w.values() if isinstance(t, PackedLinear)}
        self.weight_format = formats.pop() if len(formats) == 1 else "dense"  # one packed format per model
        if self.weight_format != "dense" and not isinstance(head, PackedLinear):
            # the output head is a decode step's largest matrix: 8-bit like the GGUF's Q8_0 embedding
            self.lm_head = Q8Linear.quantize(head)
        self.layers: list[Layer] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            bias = None
            if c.attention_bias:
                bias = torch.cat([get(a + f"{n}_proj.bias") for n in "qkv"])
            self.layers.append(Layer(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=fused([a + f"{n}_proj.weight" for n in "qkv"]),
                qkv_bias=bias,
                q_norm=get(a + "q_norm.weight") if c.qk_norm else None,
                k_norm=get(a + "k_norm.weight") if c.qk_norm else None,
                o=get(a + "o_proj.weight"),
                post_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=fused([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
                down=get(p + "mlp.down_proj.weight"),
            ))
        self.inv_freq = c.rope_inv_freq().to(device=device, dtype=torch.float32)
        self.scale = c.head_dim ** -0.5
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim

    @property
    def lora(self):
        """Adapters are never model state: a Model is shared by generators whose caches differ per adapter set."""
        raise AttributeError(_NO_LORA_STATE)

    @lora.setter
    def lora(self, value) -> None:
        raise AttributeError(_NO_LORA_STATE)

    @classmethod
    def load(cls, path: str | Path | None = None, device: str | torch.device | None = None,
             dtype: torch.dtype | None = None, progress: Callable[[float], None] | None = None,
             weights: str = "dense") -> "Model":
        """Load an HF folder or a .gguf file (None = the embedded SmolLM2-135M-Instruct).

        weights="dense" dequantizes everything to `dtype` (exact, the default); "q4" keeps a GGUF's 4-bit
        projection matrices packed; "q8" quantizes the projection matrices of any checkpoint to int8 per
        32 at load; both also pack the output head to 8 bits and run decode rows through pagedeck's CPU
        kernels (several times fewer bytes per token, int8 activations; see engine/model/qlinear.py); "auto"
        picks q4 for a GGUF on a CPU."""
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
        from .weights import default_model_path

        t0 = time.perf_counter()
        resolved = Path(path) if path is not None else default_model_path()
        dev = torch.device(device) if device is not None else default_device()
        dt = dtype if dtype is not None else default_dtype(dev)
        if weights == "auto":  # the fast path where it exists: 4-bit GGUF weights on a CPU
            weights = "q4" if dev.type == "cpu" and resolved.suffix.lower() == ".gguf" and q4_supported() else "dense"
        config, state = load_weights(resolved, dtype=dt, device="cpu", progress=progress, q4=weights == "q4")
        if weights == "q8":
            if dev.type != "cpu" or dt != torch.float32:
                raise ValueError("weights='q8' runs on the CPU in float32 only (CPU kernels)")
            state = {n: Q8Linear.quantize(t) if n.endswith(PROJECTION_NAMES) else t for n, t in state.items()}
        model = cls(config, state, dev, dt, resolved)  # a GGUF without Q4 matrices loads dense
        model.load_seconds = time.perf_counter() - t0
        if progress is not None:
            progress(1.0)
        return model

    def num_parameters(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.head_is_embedding() else [self.lm_head])
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.numel() for t in tensors)

    def memory_bytes(self) -> int:
        return self._bytes(decode=False)

    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads (packed matrices count their packed bytes, not the dense copy;
        an embedding that is not also the output head counts as not read)."""
        return self._bytes(decode=True)

    def _bytes(self, decode: bool) -> int:
        total = 0
        tensors = [self.norm] + [t for layer in self.layers for t in vars(layer).values() if t is not None]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        if not decode or self.lm_head is self.embed:  # else a step reads one embedding row per token
            tensors.append(self.embed)
        for t in tensors:
            if t is self.lm_head and isinstance(t, PackedLinear) and t.dense is self.embed:
                total += t.nbytes()  # its dense copy is the embedding, counted once
            elif isinstance(t, PackedLinear):
                total += t.nbytes() if decode else t.memory_bytes()
            else:
                total += t.numel() * t.element_size()
        return total

    def head_is_embedding(self) -> bool:
        """Whether the output head is the embedding (tied), possibly packed (then its dense copy is the embedding)."""
        h = self.lm_head
        return h is self.embed or (isinstance(h, PackedLinear) and h.dense is self.embed)

    @torch.inference_mode()
    def forward(self, batch: Batch, cache, lora: "LoRAApply | None" = None) -> torch.Tensor:
        """Run one step; returns float32 logits (len(batch.logit_rows), padded_vocab).

        lora adds adapters' low-rank updates after each fused linear, over the batch's flat rows (a LoRASet:
        one set for every row; see engine.model.lora.LoRAApply). The caller owns it, so two generators sharing
        this model never see each other's adapters."""
        c = self.config
        T = batch.input_ids.shape[0]
        eps = c.rms_norm_eps
        x = F.embedding(batch.input_ids, self.embed)
        packed = self.weight_format != "dense"  # dense stays the reference path, op for op
        # rotary + K/V write + attention in one call (fp32 pools)
        fuse = packed and self.dtype == torch.float32 and not c.qk_norm and cache.kv_quant is None
        plan = kernels.plan_step(batch.positions, self.inv_freq, batch.block_table, batch.cu_q, batch.kv_lens,
                                 cache.page_size, fuse=fuse)
        rows = RowSplit.of_batch(batch.prompt_rows, batch.cu_q) if packed else None
        stack = self._packed_stack() if plan.fused and plan.attention is None and lora is None else None
        if stack is not None and (rows.prompt_rows is None or rows.prompt_rows.numel() == 0):
            # every row packed, every chunk short: all layers in one call, the same kernels as _layers
            x, residual = kernels.decode_layers(x, stack, cache.k, cache.v, batch.slot_mapping, batch.block_table,
                                                batch.cu_q, batch.kv_lens, c.num_heads, self.scale, eps, plan)
        else:
            x, residual = self._layers(x, batch, cache, plan, rows, lora)
        x = (x + residual).index_select(0, batch.logit_rows)
        x, _ = kernels.rms_norm(x, self.norm, eps, fast=packed)
        head_rows = RowSplit.of_rows(rows.prompt_rows, T, batch.logit_rows) if packed else None
        return self._head(x, head_rows).float()

    def _layers(self, x: torch.Tensor, batch: Batch, cache, plan, rows: RowSplit | None,
                lora: "LoRAApply | None"):
        """The decoder layers op by op (returns the last output and the residual stream)."""
        c = self.config
        eps = c.rms_norm_eps
        packed = rows is not None
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = kernels.rms_norm(x, layer.input_norm, eps, residual, packed)
            qkv = linear(h, layer.qkv, layer.qkv_bias, rows)
            if lora is not None:
                lora.add(i, "qkv", h, qkv)
            if plan.fused:
                o = kernels.fused_attention(qkv, cache.k[i], cache.v[i], batch.slot_mapping, batch.block_table,
                                            batch.cu_q, batch.kv_lens, c.num_heads, self.scale, plan)
            else:
                o = self._attention(i, layer, qkv, batch, cache, plan)
            x = linear(o, layer.o, rows=rows)
            if lora is not None:
                lora.add(i, "o", o, x)
            h, residual = kernels.rms_norm(x, layer.post_norm, eps, residual, packed)
            if lora is None:
                a = linear(h, layer.gate_up, rows=rows, act="swiglu")
            else:
                gu = linear(h, layer.gate_up, rows=rows)
                lora.add(i, "gate_up", h, gu)
                a = kernels.silu_mul(gu)
            x = linear(a, layer.down, rows=rows)
            if lora is not None:
                lora.add(i, "down", a, x)
        return x, residual

    def _packed_stack(self) -> list[torch.Tensor] | None:
        """kernels.decode_layers' weight list (built once), or None where a layer has what it doesn't do
        (a dense or biased projection, q/k norms)."""
        if not hasattr(self, "_stack"):
            self._stack = []
            for layer in self.layers:
                weights = (layer.qkv, layer.o, layer.gate_up, layer.down)
                if layer.qkv_bias is not None or layer.q_norm is not None or not all(
                        isinstance(w, PackedLinear) for w in weights):
                    self._stack = None
                    break
                self._stack += [layer.input_norm, layer.post_norm]
                for w in weights:
                    codes, scales, minimums = w._kernel_args()
                    self._stack += [codes, scales, minimums if minimums is not None else scales.new_empty(0)]
        return self._stack

    def _attention(self, i: int, layer: Layer, qkv: torch.Tensor, batch: Batch, cache, plan) -> torch.Tensor:
        """Split q|k|v, rotary, K/V into the cache, paged attention: the reference path, op by op."""
        c = self.config
        T = qkv.shape[0]
        q = qkv[:, : self.q_size].reshape(T, c.num_heads, c.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(T, c.num_kv_heads, c.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].reshape(T, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None:
            q = kernels.rms_norm(q, layer.q_norm, c.rms_norm_eps)[0]
            k = kernels.rms_norm(k, layer.k_norm, c.rms_norm_eps)[0]
        q, k = q.contiguous(), k.contiguous()
        kernels.apply_rotary(q, k, batch.positions, self.inv_freq, plan)
        kernels.write_kv(k, v, cache.k[i], cache.v[i], batch.slot_mapping)
        o = kernels.paged_attention(q, cache.k[i], cache.v[i], batch.block_table, batch.cu_q,
                                    batch.kv_lens, self.scale, plan)
        return o.reshape(T, self.q_size)

    def _head(self, x: torch.Tensor, rows: RowSplit | None = None) -> torch.Tensor:
        """The output projection (packed: prompt rows through the dense copy, like the layers). On CPU,
        8-15 rows are padded to 16 for dense: MKL's sgemm for this wide, flat shape is ~1.5x slower at
        those row counts than at 16 (measured, see kernels/PERF.md)."""
        if isinstance(self.lm_head, PackedLinear):
            return linear(x, self.lm_head, rows=rows)
        rows = x.shape[0]
        if x.device.type == "cpu" and 8 <= rows < 16:
            return F.linear(F.pad(x, (0, 0, 0, 16 - rows)), self.lm_head)[:rows]
        return F.linear(x, self.lm_head)

    def forward_tokens(self, input_ids: torch.Tensor, lora: "LoRAApply | None" = None) -> torch.Tensor:
        """Logits for every position of one sequence (1, n), through a throwaway cache: for tests and tools."""
        from ..cache.paged_cache import PagedCache

        ids = input_ids.reshape(-1).tolist()
        page = 16
        cache = PagedCache(self, max_tokens=max(page, -(-len(ids) // page) * page), page_size=page)
        batch = Batch.build([(ids, 0, list(range(cache.num_pages)))], page, [len(ids)], self.device, [True])
        return self.forward(batch, cache, lora)[:, : self.vocab_size]
