"""Reading a GGUF file into an HF-named state dict: llama.cpp's tensor names mapped to HF's, q/k rows back in
rotate_half order, quantized matrices packed for the CPU kernels (engine.model.packing.repack) or dequantized."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from engine import envs
from engine.model import moe
from engine.model.embedding import GGMLRows
from engine.model.packing import fused_on_read, move_queue
from engine.model.packing import repack
from engine.model.config import ModelConfig
from engine.model.ggml_blocks import dequantizable
from engine.model.gguf.file import GGUFFile, GGUFTensorInfo
from engine.model.heap import release_freed_memory
from engine.model.tensor_names import check_names, check_shapes, expected_tensor_names, keeps_dense_copy
from kernels import cpu_ext

Progress = Callable[[float], None] | None

# ---------------------------------------------------------------- GGUF -> HF names

_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",  # gpt-oss's MLP input norm (Gemma's: _GGUF_SANDWICH_NAMES)
    "attn_sinks": "self_attn.sinks",  # gpt-oss's per-head sink logits, a bare parameter in HF (no .weight)
    # a mixture of experts' router (its HF name per architecture: moe.router_name; the experts:
    # engine.model.moe.gguf_expert_names)
    "ffn_gate_inp": "mlp.gate",
}
_BARE = ("self_attn.sinks",)  # HF names without a .weight suffix
# Gemma 2/3 (sandwich norms): HF's post_attention_layernorm is the attention output's norm there.
_GGUF_SANDWICH_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                        "post_ffw_norm": "post_feedforward_layernorm"}
_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# folded into config.rope_scaling
_GGUF_IGNORED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}


def hf_name(gguf_name: str, config: ModelConfig | None = None) -> str | None:
    """HF name of a GGUF tensor name, or None when it has no HF counterpart here. The config decides the
    names that depend on the layout: Gemma's sandwich norms, Phi-3's fused gate|up in ffn_up, the router's
    name (Qwen3-MoE's mlp.gate, gpt-oss's mlp.router)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        mapped = _GGUF_LAYER_NAMES.get(part)
        if config is not None and config.sandwich_norm:
            mapped = _GGUF_SANDWICH_NAMES.get(part, mapped)
        if config is not None and config.fused_projections and part == "ffn_up":
            mapped = "mlp.gate_up_proj"
        if config is not None and config.num_experts and part == "ffn_gate_inp":
            mapped = moe.router_name(config)
        if mapped in _BARE:
            return f"model.layers.{layer}.{mapped}" if suffix == "weight" else None
        return f"model.layers.{layer}.{mapped}.{suffix}" if mapped else None
    mapped = _GGUF_GLOBAL_NAMES.get(base)
    return f"{mapped}.{suffix}" if mapped else None


def _check_types(path: Path, tensors: list[GGUFTensorInfo]) -> None:
    """Refuse a file up front, in one line naming the tensor and its type, when a tensor the model needs is
    of a ggml type we cannot decode (Q8_K, integer types...), rather than failing halfway through loading."""
    for t in tensors:
        if not dequantizable(t.tensor_type):
            raise ValueError(f"{path}: tensor {t.name} is stored as ggml type {t.tensor_type.name}, which pagedeck "
                             f"cannot read")


class Unmoved:
    """A load whose byte moves have not run (engine.model.settle runs them): the queue, its segments marked per
    tensor with (the layer it belongs to: its index, or "global" for the embedding, head and final norm; the
    tensor's GGUF name), the file, and `mapped`: the state as views of the file (the kernel formats that read
    the file's blocks as stored, in rows), for the model to start on."""

    def __init__(self, moves: move_queue.MoveQueue, gguf: GGUFFile, mapped: dict):
        self.moves, self.gguf, self.mapped = moves, gguf, mapped


def load_gguf(path: Path, dtype: torch.dtype, device: torch.device, progress: Progress, fmt: str = "dense",
              moving: Callable[[], None] | None = None, start_mapped: bool = False):
    """(config, HF-named state, Unmoved or None) of a GGUF file. The byte moves out of the mapped file are
    queued as the tensors are walked and run at the end in one C++ call (engine.model.packing.move_queue);
    `moving()` is called as they start, when the GIL is free for the caller's other work. With `start_mapped`,
    where the model can start on the mapped file (_mapped_formats) the moves are not run: they come back in an
    Unmoved, with the state of views the model starts on, and the state's packed tensors stay empty until they
    run."""
    gf = GGUFFile(path, header_only=True)  # the config needs only the vocabulary's length
    with move_queue.deferring(gf.spans()) as moves:
        config, state, expected, unexpected, total, mapped = _read_tensors(gf, path, dtype, device, progress, fmt,
                                                                         start_mapped)
        check_names(path, expected, state, unexpected)
        check_shapes(path, config, state)
        if mapped is not None:
            if moving is not None:
                moving()
            return config, state, Unmoved(moves, gf, mapped)
        queued = moves.nbytes
        moves.run(None if progress is None else lambda moved: progress((total - queued + moved) / total), moving)
    gf.close()  # nothing loaded views the file: unmap it
    return config, state, None


def _layer_key(gguf_name: str) -> object:
    """The layer a GGUF tensor belongs to (its index), or "global" (embedding, head, final norm)."""
    return int(gguf_name.split(".")[1]) if gguf_name.startswith("blk.") else "global"


def _fusion_reads_nothing(mapped_as: dict[str, type], fused: dict) -> bool:
    """Whether building the settled weights reads no part's bytes (it runs before the moves fill them): every
    q|k|v and gate|up group is written while reading (fused_on_read's plan) or stays in parts (mixed formats,
    qlinear.PartsLinear); a group stacked after packing would be stacked from still-empty parts."""
    for group in fused_on_read.FUSED_NAMES:
        for name in mapped_as:
            if not name.endswith(group[0]):
                continue
            names = [name[: -len(group[0])] + part for part in group]
            if not any(n in fused for n in names) and len({mapped_as.get(n) for n in names}) == 1:
                return False
    return True


def _mapped_formats(todo: list, stacks: list, fmt: str, keep_dense: bool, tied: bool,
                    packs: bool) -> dict[str, type] | None:
    """{HF name: the block class reading it as the file stores it} for every packed matrix of the walk, where
    the model can start on the mapped file: weights="packed" with the C++ kernels built, no dense prompt-row
    weights (PartsLinear parts keep none), no expert stacks, and every packed matrix in a format the kernels
    read as the file's blocks (K-quants, IQ4, Q8_0 and Q5_0 through q8s and q5s). None otherwise (or under
    PAGEDECK_MAPPED_START=0)."""
    if (not envs.PAGEDECK_MAPPED_START or fmt != "packed" or keep_dense or stacks or not packs
            or not cpu_ext.available()):
        return None
    out = {}
    for t, name in todo:
        table = repack.gguf_table(name, tied, packs)
        if table == "rows" or not (table == "head" or repack.keeps_packed(name, t.tensor_type.name, len(t.shape), fmt)):
            continue
        cls = repack.start_class(t.tensor_type.name, fmt)
        if cls is None or len(t.shape) != 2 or t.shape[-1] % cls.spec.values:
            return None
        out[name] = cls
    return out


def _read_tensors(gf: GGUFFile, path: Path, dtype: torch.dtype, device: torch.device, progress: Progress, fmt: str,
                  start_mapped: bool):
    config = ModelConfig.from_gguf(gf)
    permute = config.arch in ("llama", "mistral")  # llama.cpp only reorders q/k rows for llama-family files
    expected = expected_tensor_names(config)
    wanted = set(expected)
    todo, unexpected, stacks = [], [], []
    for t in gf.tensors:
        name = hf_name(t.name, config)
        experts = moe.gguf_expert_names(t.name, config)
        if experts and wanted.issuperset(experts):
            stacks.append((t, experts))
        elif name in wanted:
            todo.append((t, name))
        elif t.name not in _GGUF_IGNORED and not (name == "lm_head.weight" and config.tie_word_embeddings):
            unexpected.append(t.name)
    _check_types(path, [t for t, _ in todo + stacks])
    total = sum(t.nbytes for t, _ in todo + stacks) or 1
    types = {name: t.tensor_type.name for t, name in todo}
    tied = "lm_head.weight" not in types  # the token embedding is the output head too
    types.update((name, t.tensor_type.name) for t, experts in stacks for name in experts)
    keep_dense = keeps_dense_copy(config, fmt, types.get)
    packs = any(repack.keeps_packed(name, t.tensor_type.name, len(t.shape), fmt) for t, name in todo) or any(
        repack.keeps_packed(t.name, t.tensor_type.name, len(t.shape), fmt) for t, _ in stacks)
    fused = fused_on_read.plan({name: (t.tensor_type, t.shape) for t, name in todo}, fmt, keep_dense)
    mapped_as = _mapped_formats(todo, stacks, fmt, keep_dense, tied, packs) if start_mapped else None
    if mapped_as is not None and not _fusion_reads_nothing(mapped_as, fused):
        mapped_as = None
    mapped: dict | None = None if mapped_as is None else {}
    pairs = moe.gguf_gate_up_pairs([t.name for t, _ in stacks], config)  # gate's stack -> up's
    renamed: dict[str, str] = {}  # experts' gate and up names -> their fused [gate | up]'s, where written so
    done = 0
    state: dict[str, torch.Tensor] = {}
    for t, name in todo:
        heads = None
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = config.num_heads
        elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = config.num_kv_heads
        table = repack.gguf_table(name, tied, packs)
        rows = gf.rows(t.name, heads)[1] if name in fused or (mapped_as and name in mapped_as) else None
        if mapped is not None:  # the model's first state: the file's own rows (q/k of llama files a copy)
            if name in mapped_as:
                mapped[name] = mapped_as[name](rows.reshape(int(t.shape[-2]), -1), keep_rows=True)
            elif table == "rows":
                mapped[name] = GGMLRows(gf.raw(t.name).reshape(int(t.shape[-2]), -1), t.tensor_type, tuple(t.shape))
        if name in fused:  # written into its rows of the fused matrix, which joins the state once complete
            whole = fused[name].write(name, rows)
            if whole is not None:
                state[fused[name].name] = whole
        elif table == "rows":
            state[name] = gf.embedding_rows(t.name)
        else:
            kept = gf.packed(t.name, heads, fmt, keep_dense, head=table == "head")
            state[name] = kept if kept is not None else gf.tensor(t.name, dtype, device, row_perm_heads=heads)
            if kept is not None:
                release_freed_memory()  # repacking frees tile temporaries: give them back before the next tensor
        # copied or packed: the file's pages need not stay resident. Where the model starts on them, this runs
        # with the tensor's moves in the settling (a step meanwhile reads them back from the page cache; the
        # settling lets go again what steps read once it hands the model the tensor's layer)
        gf.release(t.name)
        if mapped is not None:
            move_queue.mark((_layer_key(t.name), t.name))
            if name not in mapped and name in state:
                mapped[name] = state[name]  # norms, biases: no move, the same tensor
        done += t.nbytes
        if progress:
            progress((done - move_queue.pending()) / total)
    by_name = {t.name: (t, experts) for t, experts in stacks}
    joined: set[str] = set()  # up stacks already written into their experts' [gate | up]
    for t, experts in stacks:  # one (rows, cols) matrix per expert: packed expert by expert, or dequantized
        if t.name in joined:
            continue
        names, kept = experts, None
        if t.name in pairs:  # gate's stack: written with up's into each expert's [gate | up] where the format allows
            up = by_name[pairs[t.name]][0]
            kept = gf.packed_gate_up(t.name, up.name, fmt, keep_dense)
            if kept is not None:
                names = moe.gguf_gate_up_names(t.name, config)
                renamed.update(zip(experts, names))
                renamed.update(zip(by_name[up.name][1], names))
                joined.add(up.name)
                gf.release(up.name)
                done += up.nbytes
        if kept is None:
            kept = gf.packed_experts(t.name, fmt, keep_dense)
        state.update(zip(names, kept if kept is not None else gf.tensor(t.name, dtype, device).unbind(0)))
        gf.release(t.name)
        done += t.nbytes
        if progress:
            progress((done - move_queue.pending()) / total)
    expected = list(dict.fromkeys(fused[n].name if n in fused else renamed.get(n, n) for n in expected))
    return config, state, expected, unexpected, total, mapped
