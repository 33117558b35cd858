"""The decoder (Llama, Llama 3, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3) running over the paged K/V cache.

Weights are kept fused where it saves kernel launches (q|k|v and gate|up); everything else is the plain
transformer, so a reader can check it against the paper in one sitting. Architectures differ only by
ModelConfig features: extra norms around attention and MLP (Gemma 2/3), q/k norms, GeGLU, embedding
scaling, soft-capped scores and logits, per-layer sliding windows and rope bases, partial rotary.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

import kernels

from ..contract import WEIGHT_ALIASES, WEIGHT_FORMATS
from .batch import Batch
from .config import ModelConfig
from .qlinear import PackedLinear, Q8Linear, RowSplit, cat_packed, linear, q4_supported
from .weights import default_model_path, load_weights, release_freed_memory

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
    attn_out_norm: torch.Tensor | None  # sandwich norm on the attention output (Gemma 2/3)
    post_norm: torch.Tensor  # the MLP's input norm
    gate_up: torch.Tensor
    down: torch.Tensor
    mlp_out_norm: torch.Tensor | None  # sandwich norm on the MLP output
    window: int | None = None  # sliding window of this layer's attention
    sliding_rope: bool = False  # rotate with the sliding layers' own rope base (Gemma 3)

    def weights(self) -> list:
        """Every weight of the layer (tensors or packed matrices), for counting parameters and bytes."""
        return [t for name, t in vars(self).items() if name not in ("window", "sliding_rope") and t is not None]


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
        """Build from an HF-named state dict; the q/k/v and gate/up entries are removed from `weights` once
        fused (they would otherwise be held twice while loading)."""
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
                    raise ValueError(f"packed weights ({w[name].format}) run on the CPU only (CPU kernels); load "
                                     "with weights='dense' on a GPU")
                return w[name]
            return w[name].to(device=device, dtype=dtype)

        def fused(names: list[str], stored_fused: str):
            if c.fused_projections:
                return get(stored_fused)
            parts = [get(n) for n in names]
            for n in names:  # the parts become the fused copy: drop them so loading never holds a model twice
                w.pop(n)
            if all(isinstance(p, PackedLinear) for p in parts):
                out = cat_packed(parts, consume=True)
            else:
                out = torch.cat([p.dequantize(dtype) if isinstance(p, PackedLinear) else p for p in parts])
            parts.clear()
            release_freed_memory()  # give their pages back before the next layer's fusion allocates
            return out

        self.embed = get("model.embed_tokens.weight")
        self.vocab_size = c.vocab_size
        self.padded_vocab = kernels.pad_vocab(c.vocab_size)
        head = self.embed if c.tie_word_embeddings or "lm_head.weight" not in w else get("lm_head.weight")
        self.lm_head = head if isinstance(head, PackedLinear) else kernels.pad_embedding(head)
        self.norm = get("model.norm.weight")
        formats = {t.format for t in w.values() if isinstance(t, PackedLinear)}
        self.weight_format = formats.pop() if len(formats) == 1 else "dense"  # one packed format per model
        if self.weight_format != "dense" and not isinstance(head, PackedLinear):
            # the output head is a decode step's largest matrix: 8-bit like the GGUF's Q8_0 embedding
            self.lm_head = Q8Linear.quantize(head)
        self.layers: list[Layer] = []
        sandwich = c.sandwich_norm
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            bias = None
            if c.attention_bias:
                bias = get(a + "qkv_proj.bias") if c.fused_projections else torch.cat(
                    [get(a + f"{n}_proj.bias") for n in "qkv"])
            self.layers.append(Layer(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=fused([a + f"{n}_proj.weight" for n in "qkv"], a + "qkv_proj.weight"),
                qkv_bias=bias,
                q_norm=get(a + "q_norm.weight") if c.qk_norm else None,
                k_norm=get(a + "k_norm.weight") if c.qk_norm else None,
                o=get(a + "o_proj.weight"),
                attn_out_norm=get(p + "post_attention_layernorm.weight") if sandwich else None,
                post_norm=get(p + ("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight")),
                gate_up=fused([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], p + "mlp.gate_up_proj.weight"),
                down=get(p + "mlp.down_proj.weight"),
                mlp_out_norm=get(p + "post_feedforward_layernorm.weight") if sandwich else None,
                window=c.layer_window(i),
                sliding_rope=c.layer_uses_sliding_rope(i),
            ))
        self.inv_freq = c.rope_inv_freq().to(device=device, dtype=torch.float32)
        self.sliding_inv_freq = (c.sliding_rope_inv_freq().to(device=device, dtype=torch.float32)
                                 if c.sliding_rope_theta is not None else None)
        self.rope_factor = c.rope_attention_factor
        self.rotary_dims = c.rotary_dims
        self.long_rope = False
        self.scale = c.attn_scale
        self.act = kernels.gelu_tanh_mul if c.hidden_act == "gelu_tanh" else kernels.silu_mul
        # HF multiplies by the scale as a tensor in the weights' dtype (so bf16 rounds it too)
        self.embed_scale = (torch.tensor(c.embedding_scale, dtype=torch.float32).to(dtype).item()
                            if c.embedding_scale else None)
        packed_layers = any(isinstance(t, PackedLinear) for layer in self.layers for t in layer.weights())
        if packed_layers and not isinstance(head, PackedLinear):
            # packed layers but a dense head (an F16 output in a quantized GGUF): the head, a decode step's largest
            # matrix, gets a q8 copy whose prompt-row weights are the dense head itself
            self.lm_head = Q8Linear.quantize(head)
        # the CPU kernels' fused attention and all-layers decode do the plain architecture only
        self.fusable = not (c.qk_norm or c.sandwich_norm or c.hidden_act != "silu" or c.attn_softcap
                            or self.sliding_inv_freq is not None or self.rope_factor != 1.0
                            or self.rotary_dims != c.head_dim or any(layer.window for layer in self.layers))
        packed_weights = [t for layer in self.layers for t in layer.weights() if isinstance(t, PackedLinear)]
        self.prompt_dense = bool(packed_weights) and all(t.dense is not None for t in packed_weights)
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
             weights: str = "dense", check_memory: bool = True) -> "Model":
        """Load an HF folder or a .gguf file (None = the embedded SmolLM2-135M-Instruct).

        weights="dense" dequantizes everything to `dtype` (exact, the default); "packed" keeps a GGUF's
        quantized matrices packed for pagedeck's CPU kernels (q4 or q8 per type, engine/model/repack.py;
        several times fewer bytes per token, int8 activations); "q8" packs every matrix as Q8_0, quantizing
        dense ones (HF folders) at load; "auto" is packed for a GGUF on a CPU, else dense. "q4" is the older
        name of "packed". `check_memory` raises engine.ModelTooLarge before loading a model that will not fit."""
        weights = WEIGHT_ALIASES.get(weights, weights)
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
        from ..contract import is_gguf

        t0 = time.perf_counter()
        resolved = Path(path) if path is not None else default_model_path()
        dev = torch.device(device) if device is not None else default_device()
        dt = dtype if dtype is not None else default_dtype(dev)
        if weights == "auto":  # the fast path where it exists: quantized GGUF weights on a CPU
            weights = "packed" if dev.type == "cpu" and is_gguf(resolved) and q4_supported() else "dense"
        if check_memory and resolved.exists():
            from .memory import check_fits

            check_fits(resolved, cache_tokens=0, weights=weights, device=dev.type, dtype=str(dt).removeprefix("torch."))
        if weights in ("packed", "q8") and (dev.type != "cpu" or dt != torch.float32):
            raise ValueError(f"weights={weights!r} runs on the CPU in float32 only (CPU kernels)")
        config, state = load_weights(resolved, dtype=dt, device="cpu", progress=progress, fmt=weights)
        model = cls(config, state, dev, dt, resolved)
        del state
        release_freed_memory()
        packed = any(isinstance(t, PackedLinear) for t in model._weights())
        model.weight_format = weights if packed else "dense"  # a GGUF without quantized matrices loads dense
        model.load_seconds = time.perf_counter() - t0
        if progress is not None:
            progress(1.0)
        return model

    def use_context_length(self, n: int) -> None:
        """Pick the rope for sequences up to n tokens: LongRoPE (Phi-3) has a short-context factor set,
        exact up to its original length, and a long one beyond. Decided per context (as llama.cpp does),
        never per step, so cached keys and later queries always share one rotation."""
        threshold = self.config.long_rope_threshold
        self._set_long_rope(threshold is not None and n > threshold)

    def _set_long_rope(self, long: bool) -> None:
        if long != self.long_rope:
            self.long_rope = long
            self.inv_freq = self.config.rope_inv_freq(long=long).to(device=self.device, dtype=torch.float32)

    def _weights(self) -> list:
        tensors = [self.embed, self.norm] + [t for layer in self.layers for t in layer.weights()]
        return tensors + ([] if self.lm_head is self.embed else [self.lm_head])

    def num_parameters(self) -> int:
        head_copy = self.lm_head is not self.embed and self.head_is_embedding()  # a q8 head over the embedding
        return sum(t.numel() for t in self._weights() if not (head_copy and t is self.lm_head))

    def memory_bytes(self) -> int:
        """Bytes the weights hold (packed matrices: their blocks, plus a dense copy where one is kept)."""
        total = 0
        for t in self._weights():
            if isinstance(t, PackedLinear):
                total += t.nbytes() if t.dense is self.embed else t.memory_bytes()  # a q8 head over the embedding
            else:
                total += t.numel() * t.element_size()
        return total

    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads: all but an untied embedding table (one row of it), packed
        matrices counting their blocks (not a dense copy)."""
        tensors = [self.norm, self.lm_head] + [t for layer in self.layers for t in layer.weights()]
        return sum(t.nbytes() if isinstance(t, PackedLinear) else t.numel() * t.element_size() for t in tensors)

    def head_is_embedding(self) -> bool:
        """Whether the output head is the embedding table (tied), or a packed copy over it."""
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
        x = self.embed.embedding(batch.input_ids) if isinstance(self.embed, PackedLinear) else F.embedding(
            batch.input_ids, self.embed)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        packed = self.weight_format != "dense"  # dense stays the reference path, op for op
        # rotary + K/V write + attention in one call (fp32 pools) where the architecture is the plain one
        fuse = packed and self.fusable and self.dtype == torch.float32 and cache.kv_quant is None
        plan = kernels.plan_step(batch.positions, self.inv_freq, batch.block_table, batch.cu_q, batch.kv_lens,
                                 cache.page_size, fuse=fuse)
        # Prompt rows take the dense copy where the model keeps one (exact, sgemm-fast). A model too big for
        # one sends every row through the packed kernels: dense tiles decoded every weight for each chunk (a
        # 32-token follow-up took 2.7 s on 4 layers of a 7B-shaped file, measured), the kernels are 4-90x
        # faster below ~300 rows, and a row still takes one path whatever its chunk.
        rows = RowSplit.of_batch(batch.prompt_rows, batch.cu_q) if packed and self.prompt_dense else None
        stack = self._packed_stack() if plan.fused and plan.attention is None and lora is None else None
        if stack is not None and (rows is None or rows.prompt_rows is None):  # of_batch: no prompt rows -> None
            # every row packed, every chunk short: all layers in one call, the same kernels as _layers
            x, residual = kernels.decode_layers(x, stack, cache.k, cache.v, batch.slot_mapping, batch.block_table,
                                                batch.cu_q, batch.kv_lens, c.num_heads, self.scale, eps, plan)
        else:
            x, residual = self._layers(x, batch, cache, plan, rows, lora)
        x = (x + residual).index_select(0, batch.logit_rows)
        x, _ = kernels.rms_norm(x, self.norm, eps, fast=packed)
        head_rows = RowSplit.of_rows(rows.prompt_rows, T, batch.logit_rows) if rows is not None else None
        logits = self._head(x, head_rows).float()
        if c.final_softcap is not None:
            logits = torch.tanh(logits / c.final_softcap) * c.final_softcap
        return logits

    def _layers(self, x: torch.Tensor, batch: Batch, cache, plan, rows: RowSplit | None,
                lora: "LoRAApply | None"):
        """The decoder layers op by op (returns the last output and the residual stream)."""
        c = self.config
        eps = c.rms_norm_eps
        packed = rows is not None
        swiglu = c.hidden_act == "silu" and lora is None  # the packed kernel's fused epilogue
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
            if layer.attn_out_norm is not None:
                x = kernels.rms_norm(x, layer.attn_out_norm, eps)[0]
            h, residual = kernels.rms_norm(x, layer.post_norm, eps, residual, packed)
            if swiglu:
                a = linear(h, layer.gate_up, rows=rows, act="swiglu")
            else:
                gu = linear(h, layer.gate_up, rows=rows)
                if lora is not None:
                    lora.add(i, "gate_up", h, gu)
                a = self.act(gu)
            x = linear(a, layer.down, rows=rows)
            if lora is not None:
                lora.add(i, "down", a, x)
            if layer.mlp_out_norm is not None:
                x = kernels.rms_norm(x, layer.mlp_out_norm, eps)[0]
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
        """Split q|k|v, q/k norms, rotary (the layer's base, partial dims), K/V into the cache, paged
        attention (the layer's window, soft-capped scores): the reference path, op by op."""
        c = self.config
        T = qkv.shape[0]
        q = qkv[:, : self.q_size].reshape(T, c.num_heads, c.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(T, c.num_kv_heads, c.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].reshape(T, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None:
            q = kernels.rms_norm(q, layer.q_norm, c.rms_norm_eps)[0]
            k = kernels.rms_norm(k, layer.k_norm, c.rms_norm_eps)[0]
        q, k = q.contiguous(), k.contiguous()
        rot = self.rotary_dims
        inv_freq = self.sliding_inv_freq if layer.sliding_rope else self.inv_freq
        q_rot, k_rot = (q, k) if rot == c.head_dim else (q[..., :rot], k[..., :rot])
        kernels.apply_rotary(q_rot, k_rot, batch.positions, inv_freq, plan, self.rope_factor)
        kernels.write_kv(k, v, cache.k[i], cache.v[i], batch.slot_mapping)
        o = kernels.paged_attention(q, cache.k[i], cache.v[i], batch.block_table, batch.cu_q,
                                    batch.kv_lens, self.scale, plan, layer.window, c.attn_softcap)
        return o.reshape(T, self.q_size)

    def _head(self, x: torch.Tensor, rows: RowSplit | None = None) -> torch.Tensor:
        """The output projection. A packed head with a dense copy sends prompt rows through it (like the
        layers); without one, every row takes the packed kernel (a dense tile pass would decode the whole
        vocabulary for one prompt's last token). On CPU, 8-15 rows of a dense head are padded to 16: MKL's
        sgemm for this wide, flat shape is ~1.5x slower at those row counts than at 16 (kernels/PERF.md)."""
        if isinstance(self.lm_head, PackedLinear):
            logits = linear(x, self.lm_head, rows=rows if self.lm_head.dense is not None else None)
            return F.pad(logits, (0, self.padded_vocab - logits.shape[1]))
        n = x.shape[0]
        if x.device.type == "cpu" and 8 <= n < 16:
            return F.linear(F.pad(x, (0, 0, 0, 16 - n)), self.lm_head)[:n]
        return F.linear(x, self.lm_head)

    def forward_tokens(self, input_ids: torch.Tensor, lora: "LoRAApply | None" = None) -> torch.Tensor:
        """Logits for every position of one sequence (1, n), through a throwaway cache: for tests and tools."""
        from ..cache.paged_cache import PagedCache

        ids = input_ids.reshape(-1).tolist()
        page = 16
        cache = PagedCache(self, max_tokens=max(page, -(-len(ids) // page) * page), page_size=page)
        batch = Batch.build([(ids, 0, list(range(cache.num_pages)))], page, [len(ids)], self.device, [True])
        long_before = self.long_rope
        self.use_context_length(len(ids))  # one pass over n tokens: the rope transformers picks for n
        try:
            return self.forward(batch, cache, lora)[:, : self.vocab_size]
        finally:
            self._set_long_rope(long_before)
