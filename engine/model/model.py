"""The decoder (Llama, Llama 3, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, Qwen3-MoE, Mixtral, gpt-oss) running over the paged K/V cache.

Weights are kept fused where it saves kernel launches (q|k|v and gate|up), as engine.model.loader builds
them; everything else is the plain transformer, so a reader can check it against the paper in one sitting. Architectures differ only by
ModelConfig features: extra norms around attention and MLP (Gemma 2/3), q/k norms, GeGLU, embedding
scaling, soft-capped scores and logits, per-layer sliding windows and rope bases, partial rotary, attention
sinks and an output-projection bias (gpt-oss), and a mixture of experts in place of the MLP (engine.model.moe).
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

import kernels

from ..cache.budget import pool_dtype
from ..cache.spec import CacheSpec
from . import image_attention, loader, settle
from .batch import Batch
from .config import ModelConfig, attention_fuses, decode_layers_fit
from .embedding import GGMLRows
from .loader import Layer, ModelWeights
from .qlinear import PackedLinear, PartsLinear, RowSplit, linear
from .rotary import Rotary

if TYPE_CHECKING:
    from .lora import LoRAApply


_NO_LORA_STATE = ("Model holds no LoRA adapters: pass lora= to forward() "
                  "(DynamicGenerator.set_loras keeps each generator's own set)")


class Model:
    """Config + weights + forward. Nothing on a Model changes after it is built but the layout its weights are
    read in while they settle after loading (engine.model.settle: the same values, the same results), so
    generators share one: what differs per generator (the rotary for its context length, LoRA adapters, the
    cache) is passed to forward()."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, device: torch.device, dtype: torch.dtype,
                 path: Path | None = None):
        c = config
        self.config = config
        self.device = device
        self.dtype = dtype
        self.path = path
        self.name = path.name if path is not None else "model"
        self.weight_format = weights.weight_format
        self.embed = weights.embed
        self.lm_head = weights.lm_head
        self.norm = weights.norm
        self.layers: list[Layer] = weights.layers
        self.vocab_size = c.vocab_size
        self.padded_vocab = kernels.pad_vocab(c.vocab_size)
        # the rotation of contexts up to the original length (LongRoPE's short set): forward's default
        self.rotary = Rotary.for_context(c, device, 0)
        self.scale = c.attn_scale
        self.act = kernels.gelu_tanh_mul if c.hidden_act == "gelu_tanh" else kernels.silu_mul
        # HF multiplies by the scale as a tensor in the weights' dtype (so bf16 rounds it too)
        self.embed_scale = (torch.tensor(c.embedding_scale, dtype=torch.float32).to(dtype).item()
                            if c.embedding_scale else None)
        # the CPU kernels' fused attention serves every layer kind; their all-layers decode the plain one only
        self.fusable = attention_fuses(c)
        packed_weights = [t for layer in self.layers for t in layer.weights() if isinstance(t, PackedLinear)]
        self.prompt_dense = bool(packed_weights) and all(t.prompt_dense for t in packed_weights)
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.decode_stack = _decode_stack(self.layers) if decode_layers_fit(c) else None
        # the all-layers decode's per-layer options: facts of the config, fixed for the model's life
        self.decode_options = dict(windows=[c.layer_window(i) or 0 for i in range(c.num_layers)],
                                   sliding=[int(c.layer_uses_sliding_rope(i)) for i in range(c.num_layers)],
                                   gate="geglu" if c.hidden_act == "gelu_tanh" else "swiglu", softcap=c.attn_softcap)
        self.settle_thread = None  # Model.load's background settling of the weights (engine.model.settle)
        self.settled_event = threading.Event()  # set once the weights are in their kernel layouts
        self.settled_event.set()
        # Gemma 3 attends both ways within an image's run of embedding rows (engine.model.image_attention)
        self.bidirectional_images = c.arch == "gemma3"

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
             weights: str = "dense", check_memory: bool = True,
             moving: Callable[[], None] | None = None) -> "Model":
        """Load an HF folder or a .gguf file (None = the embedded SmolLM2-135M-Instruct).

        weights="dense" dequantizes everything to `dtype` (exact, the default); "packed" keeps a GGUF's
        quantized matrices packed for pagedeck's CPU kernels (q4 or q8 per type, engine/model/packing/repack.py;
        several times fewer bytes per token, int8 activations); "q8" packs every matrix as Q8_0, quantizing
        dense ones (HF folders) at load; "auto" is packed for a GGUF on a CPU, else dense. "q4" is the older
        name of "packed". `check_memory` raises engine.ModelTooLarge before loading a model that will not fit.
        `moving()` is called once, when the rest of the load leaves the GIL free (a GGUF's bytes moving in C++):
        engine.load_model_and_tokenizer starts the tokenizer's build there."""
        plan = loader.plan_load(path, device, dtype, weights, check_memory)
        config, built, unsettled = loader.load(plan, progress, moving)
        model = cls(config, built, plan.device, plan.dtype, plan.path)
        if unsettled is not None:
            model.settled_event.clear()
        if model.device.type == "cpu":  # the weights into their kernel layouts and onto 2 MB pages, off the load's path
            model.settle_thread = settle.in_background(model, settle.Settling(*unsettled) if unsettled else None)
        return model

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until the weights are in their kernel layouts (engine.model.settle; at once where the load built
        them so); False if `timeout` seconds passed first. Results never depend on it: tools and tests that
        inspect the layouts, and benchmarks of the steady state, wait."""
        return self.settled_event.wait(timeout)

    def adopt(self, part: int | str, weights: ModelWeights) -> None:
        """Take `weights`' layer `part` (an index), or for part "global" its embedding, head and final norm: the
        same values in another layout (engine.model.settle hands them over as they settle). A step running
        meanwhile reads each layer either way."""
        if part == "global":
            loader.group_head(weights.lm_head)  # its bytes have moved now
            self.embed, self.lm_head, self.norm = weights.embed, weights.lm_head, weights.norm
        else:
            loader.group_matrices([weights.layers[part]])  # its bytes have moved now
            self.layers[part] = weights.layers[part]
            if self.decode_stack is not None:  # a step reads the stack once: it sees the old layer or the new
                self.decode_stack = _decode_stack(self.layers)

    def settled(self, adopted: bool = True) -> None:
        """Settling ended: with every part `adopted`, the all-layers decode's weight list over the settled layers;
        otherwise (it failed, or the process exits) the model stays on what it has."""
        if adopted:
            self.decode_stack = _decode_stack(self.layers) if decode_layers_fit(self.config) else None
        self.settled_event.set()

    @classmethod
    def from_state_dict(cls, config: ModelConfig, state: dict[str, torch.Tensor], device: torch.device,
                        dtype: torch.dtype) -> "Model":
        """A model of an HF-named state dict held in memory (the fused parts are removed from `state`)."""
        return cls(config, loader.build(config, state, device, dtype), device, dtype)

    def cache_spec(self) -> CacheSpec:
        """What a PagedCache for this model holds: one pool per layer of K/V heads, in kv_pool_dtype."""
        c = self.config
        return CacheSpec(c.num_layers, c.num_kv_heads, c.head_dim, self.kv_pool_dtype(), self.device)

    def kv_pool_dtype(self) -> torch.dtype:
        """The K/V pools' element type: fp16 where packed weights on a CPU take the fused attention
        (engine.cache.budget.pool_dtype says why), else the model's dtype."""
        return pool_dtype(self.device.type, self.dtype, self.weight_format, self.fusable)

    def rotary_for(self, n: int) -> Rotary:
        """The rotation for contexts up to n tokens (a generator builds it once for its max_seq_len)."""
        return Rotary.for_context(self.config, self.device, n)

    def _weights(self) -> list:
        tensors = [self.embed, self.norm] + [t for layer in self.layers for t in layer.weights()]
        return tensors + ([] if self.lm_head is self.embed else [self.lm_head])

    def num_parameters(self) -> int:
        head_copy = self.lm_head is not self.embed and self.head_is_embedding()  # a q8 head over the embedding
        return sum(t.numel() for t in self._weights() if not (head_copy and t is self.lm_head))

    def memory_bytes(self) -> int:
        """Bytes the loaded weights hold: every distinct storage behind them, counted once (a tied table that is
        both embedding and head, a packed matrix's blocks, scales and dense copy where one is kept, an
        embedding kept as its file's rows). The figure the estimate (engine.estimate_memory) predicts, the
        app shows and tools.bench.memory_table compares with resident memory; a tensor still viewing the mapped
        file would count the whole file here."""
        return sum(storage.nbytes() for storage in self.weight_storages())

    def weight_storages(self) -> list[torch.UntypedStorage]:
        """Every distinct storage behind the weights, once each (see memory_bytes)."""
        seen, out = set(), []
        for t in self._weights():
            if isinstance(t, PackedLinear):
                parts = [*t.blocks, t.dense, *(getattr(t, "_int4", None) or ())]
            elif isinstance(t, GGMLRows):
                parts = t.tensors()
            else:
                parts = [t]
            for part in parts:
                if part is None:
                    continue
                storage = part.untyped_storage()
                key = (part.device, storage.data_ptr())
                if key not in seen:
                    seen.add(key)
                    out.append(storage)
        return out

    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads: all but an untied embedding table (one row of it), packed
        matrices counting their blocks (not a dense copy), a mixture of experts its router and top-k experts."""
        tensors = [self.norm, self.lm_head] + [t for layer in self.layers for t in layer.weights(experts=False)]
        return (sum(t.nbytes() if isinstance(t, PackedLinear) else t.numel() * t.element_size() for t in tensors)
                + sum(layer.moe.decode_bytes() for layer in self.layers if layer.moe is not None))

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings of token ids (scaled where the architecture scales them, as Gemma does): rows
        of a dense table, of a packed head's table (tied), or decoded from the file's rows (GGMLRows)."""
        if isinstance(self.embed, (PackedLinear, GGMLRows)):
            x = self.embed.embedding(ids)
        else:
            x = F.embedding(ids, self.embed)
        return x * self.embed_scale if self.embed_scale is not None else x

    def head_is_embedding(self) -> bool:
        """Whether the output head is the embedding table (tied), or a packed copy over it."""
        h, e = self.lm_head, self.embed
        if isinstance(h, torch.Tensor) and isinstance(e, torch.Tensor):  # the embedding a view of the padded head
            return h.untyped_storage().data_ptr() == e.untyped_storage().data_ptr()
        return h is e or (isinstance(h, PackedLinear) and h.dense is e)

    @torch.inference_mode()
    def forward(self, batch: Batch, cache, lora: "LoRAApply | None" = None,
                rotary: Rotary | None = None) -> torch.Tensor:
        """Run one step; returns float32 logits (len(batch.logit_rows), padded_vocab).

        lora adds adapters' low-rank updates after each fused linear, over the batch's flat rows (a LoRASet:
        one set for every row; see engine.model.lora.LoRAApply). rotary: the rotation of the caller's context
        length (rotary_for(max_seq_len)); None is self.rotary, the one for contexts up to the original
        length. The caller owns both, so two generators sharing this model never see each other's."""
        c = self.config
        rotary = rotary if rotary is not None else self.rotary
        T = batch.input_ids.shape[0]
        eps = c.rms_norm_eps
        ids = batch.input_ids
        if batch.mm_rows is not None:  # placeholder ids (>= 1e9): any row will do, it is replaced below
            ids = ids.masked_fill(ids >= self.vocab_size, 0)
        x = self.embedding(ids)
        if batch.mm_rows is not None:
            # embedding vectors go in as given: transformers scales only the token table's rows (Gemma
            # scales inside its embedding module, before the image features are scattered in)
            x = x.index_copy(0, batch.mm_rows, batch.mm_vectors.to(device=x.device, dtype=x.dtype))
        packed = self.weight_format != "dense"  # dense stays the reference path, op for op
        # q/k norms + rotary + K/V write + attention in one call (fp32 or fp16 pools) for packed CPU models
        fuse = packed and self.fusable and self.dtype == torch.float32 and cache.kv_quant is None
        plan = kernels.plan_step(batch.positions, rotary.inv_freq, batch.block_table, batch.cu_q, batch.kv_lens,
                                 cache.page_size, fuse=fuse)
        # Prompt rows take the dense weights where the model keeps them (exact: repack's rule). A model too big for
        # one sends every row through the packed kernels: dense tiles decoded every weight for each chunk (a
        # 32-token follow-up took 2.7 s on 4 layers of a 7B-shaped file, measured), the kernels are 4-90x
        # faster below ~300 rows, and a row still takes one path whatever its chunk.
        rows = RowSplit.of_batch(batch.prompt_rows, batch.cu_q) if packed and self.prompt_dense else None
        # (image rows attend both ways within their run in Gemma 3: the per-layer path's attention does that)
        stack = self.decode_stack if plan.fused and plan.short and lora is None and not batch.mm_blocks else None
        if stack is not None and (rows is None or rows.prompt_rows is None):  # of_batch: no prompt rows -> None
            # every row packed, every chunk short: all layers in one call, the same kernels as _layers
            sliding = rotary.sliding_inv_freq
            x, residual = kernels.decode_layers(
                x, *stack, cache.k, cache.v, batch.slot_mapping, batch.block_table, batch.cu_q, batch.kv_lens,
                c.num_heads, self.scale, eps, plan, rotary=plan.rotary_tables(rotary.inv_freq, rotary.attention_factor),
                sliding_rotary=None if sliding is None else plan.rotary_tables(sliding, rotary.attention_factor),
                **self.decode_options)
        else:
            x, residual = self._layers(x, batch, cache, plan, rotary, rows, lora, packed)
        x = (x + residual).index_select(0, batch.logit_rows)
        x, _ = kernels.rms_norm(x, self.norm, eps, fast=packed)
        head_rows = RowSplit.of_rows(rows.prompt_rows, T, batch.logit_rows) if rows is not None else None
        logits = self._head(x, head_rows).float()
        if c.final_softcap is not None:
            logits = torch.tanh(logits / c.final_softcap) * c.final_softcap
        return logits

    def _layers(self, x: torch.Tensor, batch: Batch, cache, plan, rotary: Rotary, rows: RowSplit | None,
                lora: "LoRAApply | None", packed: bool):
        """The decoder layers op by op (returns the last output and the residual stream). Packed weights take
        the fast norm, as kernels.decode_layers does, whether or not prompt rows take dense weights: a row gives
        the same bits whichever path its step takes (another job's long prompt chunk sends a step here)."""
        c = self.config
        eps = c.rms_norm_eps
        swiglu = c.hidden_act == "silu" and lora is None  # the packed kernel's fused epilogue
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = kernels.rms_norm(x, layer.input_norm, eps, residual, packed)
            qkv = linear(h, layer.qkv, layer.qkv_bias, rows)
            if lora is not None:
                lora.add(i, "qkv", h, qkv)
            if plan.fused:
                o = self._fused_attention(i, layer, qkv, batch, cache, plan, rotary)
            else:
                o = self._attention(i, layer, qkv, batch, cache, plan, rotary)
            x = linear(o, layer.o, layer.o_bias, rows=rows)
            if lora is not None:
                lora.add(i, "o", o, x)
            if layer.attn_out_norm is not None:
                x = kernels.rms_norm(x, layer.attn_out_norm, eps, fast=packed)[0]
            h, residual = kernels.rms_norm(x, layer.post_norm, eps, residual, packed)
            if layer.moe is not None:  # a mixture of experts (LoRA adapters never target it: engine.model.lora)
                x = layer.moe(h, rows)
            else:
                x = self._mlp(i, layer, h, rows, lora, swiglu)
            if layer.mlp_out_norm is not None:
                x = kernels.rms_norm(x, layer.mlp_out_norm, eps, fast=packed)[0]
        return x, residual

    def _mlp(self, i: int, layer: Layer, h: torch.Tensor, rows: RowSplit | None, lora: "LoRAApply | None",
             swiglu: bool) -> torch.Tensor:
        """A dense layer's gated MLP (and its adapters' updates)."""
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
        return x

    def _fused_attention(self, i: int, layer: Layer, qkv: torch.Tensor, batch: Batch, cache, plan,
                         rotary: Rotary) -> torch.Tensor:
        """_attention's steps in one CPU call: q/k norms, rotary (the layer's base and factor, partial dims), K/V
        into the cache, attention (window, soft cap, sinks); image runs then attend both ways as there."""
        c = self.config
        inv_freq = rotary.sliding_inv_freq if layer.sliding_rope else rotary.inv_freq
        o, q = kernels.fused_attention(qkv, cache.k[i], cache.v[i], batch.slot_mapping, batch.block_table, batch.cu_q,
                                       batch.kv_lens, c.num_heads, self.scale, plan, layer.sinks,
                                       rotary=plan.rotary_tables(inv_freq, rotary.attention_factor),
                                       q_norm=layer.q_norm, k_norm=layer.k_norm, norm_eps=c.rms_norm_eps,
                                       window=layer.window, softcap=c.attn_softcap, with_q=True)
        if batch.mm_blocks:
            o = o.view(-1, c.num_heads, c.head_dim)
            image_attention.attend_blocks(o, q, cache.k[i], cache.v[i], batch, cache.page_size, self.scale,
                                          layer.window, c.attn_softcap)
        return o.reshape(-1, self.q_size)

    def _attention(self, i: int, layer: Layer, qkv: torch.Tensor, batch: Batch, cache, plan,
                   rotary: Rotary) -> torch.Tensor:
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
        rot = rotary.dims
        inv_freq = rotary.sliding_inv_freq if layer.sliding_rope else rotary.inv_freq
        q_rot, k_rot = (q, k) if rot == c.head_dim else (q[..., :rot], k[..., :rot])
        kernels.apply_rotary(q_rot, k_rot, batch.positions, inv_freq, plan, rotary.attention_factor)
        kernels.write_kv(k, v, cache.k[i], cache.v[i], batch.slot_mapping)
        o = kernels.paged_attention(q, cache.k[i], cache.v[i], batch.block_table, batch.cu_q,
                                    batch.kv_lens, self.scale, plan, layer.window, c.attn_softcap, layer.sinks)
        if batch.mm_blocks:  # image runs that attend both ways (Gemma 3)
            image_attention.attend_blocks(o, q, cache.k[i], cache.v[i], batch, cache.page_size, self.scale,
                                          layer.window, c.attn_softcap)
        return o.reshape(T, self.q_size)

    def _head(self, x: torch.Tensor, rows: RowSplit | None = None) -> torch.Tensor:
        """The output projection. A packed head with a dense copy sends prompt rows through it (like the
        layers); without one, every row takes the packed kernel (a dense tile pass would decode the whole
        vocabulary for one prompt's last token). On CPU, 8-15 rows of a dense head are padded to 16: MKL's
        sgemm for this wide, flat shape is ~1.5x slower at those row counts than at 16 (kernels/PERF.md)."""
        if isinstance(self.lm_head, PackedLinear):
            logits = linear(x, self.lm_head, rows=rows if self.lm_head.prompt_dense else None)
            pad = self.padded_vocab - logits.shape[1]  # F.pad copies the logits even when it adds nothing
            return F.pad(logits, (0, pad)) if pad else logits
        n = x.shape[0]
        if x.device.type == "cpu" and 8 <= n < 16:
            return F.linear(F.pad(x, (0, 0, 0, 16 - n)), self.lm_head)[:n]
        return F.linear(x, self.lm_head)


_NONE = torch.empty(0)


def _decode_stack(layers: list[Layer]) -> tuple[list[torch.Tensor], list[int], list[int]] | None:
    """kernels.decode_layers' weight list, part counts and parts' kernel ids, or None where a layer has what it
    doesn't do (a dense projection, an o bias, sinks). A q|k|v bias (Qwen2),
    per-head q/k norms (Qwen3, Gemma 3) and the norms of the attention's and the MLP's output (Gemma) ride
    along, an empty tensor where there is none."""
    stack, parts, ids = [], [], []
    for layer in layers:
        weights = (layer.qkv, layer.o, layer.gate_up, layer.down)
        if layer.o_bias is not None or layer.sinks is not None or not all(isinstance(w, PackedLinear) for w in weights):
            return None
        stack += [layer.input_norm, layer.post_norm] + [
            _NONE if t is None else t.float().contiguous()
            for t in (layer.qkv_bias, layer.q_norm, layer.k_norm, layer.attn_out_norm, layer.mlp_out_norm)]
        for w in weights:
            stack += kernels.packed.stack_entry(w.blocks)
            parts.append(len(w.parts) if isinstance(w, PartsLinear) else 1)
            ids += w.kernel_ids
    return stack, parts, ids
