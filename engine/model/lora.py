"""LoRA adapters in PEFT's on-disk format, applied on the fly as low-rank updates after each fused linear.

Why not merge them into the weights: swapping adapters must be instant, the base weights stay shared and
untouched, and each job may run its own adapters in the same batch. The cost stays small because the
adapters one step uses are stacked per fused linear (q|k|v, o, gate|up, down) into one shrink matrix and
dense per-module expand blocks (`LoRAStack`): every hook is one shrink and one expand per module however
many adapters are active; which rows meet which adapters (and with which scale) is the plan's business
(kernels.lora_plan: one set for every row here, per-job sets in engine/model/lora_batch.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch

import kernels

from ..contract.adapters import check_lora_scale
from ..contract.paths import ADAPTER_CONFIG_FILE as CONFIG_FILE
from ..contract.paths import ADAPTER_WEIGHT_FILES as WEIGHT_FILES

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KINDS = ("qkv", "o", "gate_up", "down")
KIND_MODULES = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
                "down": ("down_proj",)}
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# PEFT config keys that change the maths in ways this engine does not implement; each must be off.
_UNSUPPORTED = {
    "fan_in_fan_out": "fan_in_fan_out=True (Conv1D-style transposed weights)",
    "use_dora": "DoRA (use_dora=True)",
    "lora_bias": "a bias on lora_B (lora_bias=True)",
    "modules_to_save": "modules_to_save (fully trained extra modules such as embed_tokens/lm_head)",
    "trainable_token_indices": "trainable_token_indices (trained embedding rows)",
    "layer_replication": "layer_replication",
    "target_parameters": "target_parameters (LoRA on raw parameters)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_qalora": "QA-LoRA (use_qalora=True)",
}
_KEY = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.(lora_A|lora_B)(?:\.[^.]+)?\.weight$")


_MOE_KEY = re.compile(r"layers\.(\d+)\.(?:block_sparse_moe\.|mlp\.(?:experts\.|gate\.|(?:gate|up|down)_proj\.))")


def _refuse_experts(key: str, config, where: str) -> None:
    """Adapters on a mixture-of-experts layer's MLP (its experts, router or the MLP names of a sparse layer)
    are refused: the engine applies LoRA to dense projections only."""
    m = _MOE_KEY.search(key) if config.num_experts else None
    if m is not None and ("experts." in m[0] or "gate." in m[0] or config.layer_is_sparse(int(m[1]))):
        raise ValueError(f"{where}: tensor {key!r} adapts the mixture-of-experts MLP of layer {m[1]}; LoRA on "
                         "experts and routers is not supported yet (adapters on attention, or on a dense "
                         "layer's MLP, are)")


class MissingAdapterFile(FileNotFoundError, ValueError):
    """An adapter folder lacks a file PEFT writes (a ValueError too, so callers can catch bad adapters alike)."""


@dataclass(frozen=True)
class Geometry:
    """The shapes an adapter must fit; two models with equal geometry accept the same adapters."""

    num_layers: int
    hidden: int
    q_size: int
    kv_size: int
    intermediate: int

    @classmethod
    def of(cls, model) -> "Geometry":
        c = model.config
        return cls(c.num_layers, c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                   c.intermediate_size)

    def module(self, name: str) -> tuple[str, int, int, int]:
        """(kind, in_features, out_features, offset of its rows in the fused output) of one PEFT module."""
        h, q, kv, i = self.hidden, self.q_size, self.kv_size, self.intermediate
        return {"q_proj": ("qkv", h, q, 0), "k_proj": ("qkv", h, kv, q), "v_proj": ("qkv", h, kv, q + kv),
                "o_proj": ("o", q, h, 0), "gate_proj": ("gate_up", h, i, 0), "up_proj": ("gate_up", h, i, i),
                "down_proj": ("down", i, h, 0)}[name]


@dataclass(eq=False)
class LoRA:
    """One PEFT LoRA adapter, validated against a model's shapes. `weights[(layer, module)] = (A, B, scaling)`."""

    name: str
    path: Path | None
    rank: int
    alpha: float
    use_rslora: bool
    geometry: Geometry
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]]
    content_hash: str
    config: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | Path, model, name: str | None = None) -> "LoRA":
        """Read adapter_config.json + adapter_model.safetensors (or .bin) from a PEFT adapter folder."""
        folder = Path(path)
        if folder.is_file() and folder.name in (CONFIG_FILE, *WEIGHT_FILES):
            folder = folder.parent
        if not folder.is_dir():
            raise MissingAdapterFile(f"LoRA adapter folder {str(folder)!r} does not exist")
        config_path = folder / CONFIG_FILE
        if not config_path.is_file():
            raise MissingAdapterFile(f"LoRA adapter {str(folder)!r} has no {CONFIG_FILE}")
        weight_path = next((folder / f for f in WEIGHT_FILES if (folder / f).is_file()), None)
        if weight_path is None:
            raise MissingAdapterFile(f"LoRA adapter {str(folder)!r} has no weights ({' or '.join(WEIGHT_FILES)})")
        config_bytes = config_path.read_bytes()
        try:
            config = json.loads(config_bytes)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{config_path} is not valid JSON: {exc}") from None
        if not isinstance(config, dict):
            raise ValueError(f"{config_path} must hold a JSON object")
        tensors = _read_tensors(weight_path)
        digest = hashlib.blake2b(config_bytes, digest_size=16)
        digest.update(weight_path.read_bytes())
        return cls.from_state_dict(config, tensors, model, name=name or folder.name, path=folder,
                                   content_hash=digest.hexdigest())

    @classmethod
    def from_state_dict(cls, config: dict, tensors: dict[str, torch.Tensor], model, name: str = "lora",
                        path: Path | None = None, content_hash: str | None = None) -> "LoRA":
        """Build from a PEFT config dict and its saved tensors (as in adapter_model.safetensors)."""
        where = f"LoRA adapter {name!r}"
        rank, alpha, use_rslora = _check_config(config, where)
        geometry = Geometry.of(model)
        pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            _refuse_experts(key, model.config, where)
            m = _KEY.match(key)
            if m is None:
                raise ValueError(f"{where}: unsupported tensor {key!r} (only LoRA A/B weights of "
                                 f"{', '.join(MODULES)} are supported: no embeddings, lm_head, biases or DoRA)")
            layer, parent, module, ab = int(m[1]), m[2], m[3], m[4]
            if module not in MODULES or _PARENT[module] != parent:
                raise ValueError(f"{where}: tensor {key!r} targets {parent}.{module}, which is not supported "
                                 f"(supported target modules: {', '.join(MODULES)})")
            if layer >= geometry.num_layers:
                raise ValueError(f"{where} was made for a different base model: tensor {key!r} is for layer {layer}, "
                                 f"the model has {geometry.num_layers} layers")
            slot = pairs.setdefault((layer, module), {})
            if ab in slot:
                raise ValueError(f"{where}: two tensors for layer {layer} {module} {ab}")
            slot[ab] = tensor
        if not pairs:
            raise ValueError(f"{where} holds no LoRA weights")
        weights = {}
        for (layer, module), slot in sorted(pairs.items()):
            if set(slot) != {"lora_A", "lora_B"}:
                raise ValueError(f"{where}: layer {layer} {module} has {next(iter(slot))} but not its partner")
            a, b = slot["lora_A"], slot["lora_B"]
            _, n_in, n_out, _ = geometry.module(module)
            if a.dim() != 2 or b.dim() != 2 or a.shape[1] != n_in or b.shape[0] != n_out or a.shape[0] != b.shape[1]:
                raise ValueError(
                    f"{where} does not fit this model (shape mismatch, made for a different base model?): "
                    f"layer {layer} {module} has A {tuple(a.shape)} and B {tuple(b.shape)}, the model needs "
                    f"A (r, {n_in}) and B ({n_out}, r)")
            if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
                raise ValueError(f"{where}: layer {layer} {module} holds NaN or infinite weights")
            r_mod = a.shape[0]
            module_key = f"model.layers.{layer}.{_PARENT[module]}.{module}"
            r_cfg = int(_pattern_value(config.get("rank_pattern"), module_key, rank))
            if r_mod != r_cfg:
                raise ValueError(f"{where}: layer {layer} {module} has rank {r_mod} but the config says r={r_cfg}")
            a_mod = float(_pattern_value(config.get("alpha_pattern"), module_key, alpha))
            scaling = a_mod / (math.sqrt(r_mod) if use_rslora else r_mod)
            weights[(layer, module)] = (a.to(model.device, model.dtype), b.to(model.device, model.dtype), scaling)
        if content_hash is None:
            h = hashlib.blake2b(json.dumps(config, sort_keys=True, default=str).encode(), digest_size=16)
            for key in sorted(tensors):
                h.update(key.encode())
                h.update(tensors[key].detach().cpu().float().numpy().tobytes())
            content_hash = h.hexdigest()
        return cls(name, path, rank, alpha, use_rslora, geometry, weights, content_hash, config)

    @property
    def target_modules(self) -> list[str]:
        found = {module for _, module in self.weights}
        return [m for m in MODULES if m in found]

    def delta(self, layer: int, module: str) -> torch.Tensor | None:
        """scaling * B @ A: what merging this adapter would add to one weight (for tests and tools)."""
        if (layer, module) not in self.weights:
            return None
        a, b, s = self.weights[(layer, module)]
        return s * (b.float() @ a.float())

    def __repr__(self) -> str:
        return (f"LoRA({self.name!r}, r={self.rank}, alpha={self.alpha:g}, rslora={self.use_rslora}, "
                f"modules={self.target_modules}, layers={len({l for l, _ in self.weights})})")


class LoRAApply(Protocol):
    """What Model.forward(batch, cache, lora=...) takes: adds low-rank updates to the flat rows of one step.

    The model calls add() after each fused linear with that linear's input x (T, in) and output y (T, out).
    LoRASet applies one adapter set to every row; LoRABatch (lora_batch.py) gives each job's rows their own
    set (Punica-style), through the same stacks and kernels.
    """

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> None: ...


def check_fits(model, lora: LoRA) -> None:
    """A LoRA object loaded for another model's shapes is refused before it reaches a forward."""
    geometry = Geometry.of(model)
    if lora.geometry != geometry:
        raise ValueError(f"LoRA adapter {lora.name!r} was loaded for a different model ({lora.geometry} vs {geometry})")


def combine(pairs: Iterable[tuple[LoRA, float]]) -> list[tuple[LoRA, float]]:
    """One entry per adapter (a repeated adapter's scales add up), in a canonical order (by content), so
    equal sets stack, compute and hash alike whatever order they were named in."""
    merged: dict[int, list] = {}
    for lora, scale in pairs:
        entry = merged.setdefault(id(lora), [lora, 0.0])
        entry[1] += float(scale)
    return sorted(((lora, scale) for lora, scale in merged.values()), key=lambda p: (p[0].content_hash, p[1]))


def adapter_identity(pairs: Iterable[tuple[LoRA, float]]) -> tuple | None:
    """Hashable, repr-stable identity of an adapter set for the page table's root hash: K/V computed under
    it depends on the adapters' content and scales (not their names or paths). None: no adapters."""
    out = tuple((lora.content_hash, scale) for lora, scale in combine(pairs))
    return out or None


class LoRAStack:
    """Distinct adapters' weights stacked per (layer, fused linear); built once per adapter combination.

    Columns are grouped by module, then by adapter: the shrink is one matmul over the fused linear's input
    for every module and adapter, and each module's expand is one dense (rank, out) block added into its
    slice of the output (no zero blocks to read). B carries each adapter's alpha/r; the scale a set gives
    an adapter lives in the plan, so the stack serves every set of the same adapters.
    """

    def __init__(self, model, adapters: Sequence[LoRA]):
        geometry = Geometry.of(model)
        for lora in adapters:
            check_fits(model, lora)
        self.adapters = tuple(adapters)
        self.device = model.device
        layouts: dict[tuple[int, ...], int] = {}
        self.entries: dict[tuple[int, str], tuple[torch.Tensor, tuple, int]] = {}
        for layer in range(geometry.num_layers):
            for kind, modules in KIND_MODULES.items():
                a_parts, owner, expands = [], [], []
                for module in modules:
                    _, _, n_out, offset = geometry.module(module)
                    b_parts, c0 = [], len(owner)
                    for j, lora in enumerate(self.adapters):
                        if (layer, module) in lora.weights:
                            a, b, scaling = lora.weights[(layer, module)]
                            a_parts.append(a.t())
                            b_parts.append((b.float().t() * scaling).to(model.dtype))
                            owner += [j] * a.shape[0]
                    if b_parts:
                        expands.append((offset, n_out, c0, len(owner), torch.cat(b_parts).contiguous()))
                if a_parts:
                    a_t = torch.cat(a_parts, 1).to(model.device, model.dtype).contiguous()
                    layout = layouts.setdefault(tuple(owner), len(layouts))
                    self.entries[(layer, kind)] = (a_t, tuple(expands), layout)
        # per column layout: which adapter owns each column (host side: plans are built on the host)
        self.layouts = [torch.tensor(owner, dtype=torch.long) for owner in layouts]

    def plans(self, adapter_scale: torch.Tensor, seg_rows: Sequence[int] | None) -> list[kernels.LoRAPlan]:
        """One plan per column layout, from (segments, adapters) scales on the host."""
        return [kernels.lora_plan(adapter_scale[:, owner], seg_rows, self.device) for owner in self.layouts]

    def apply(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor,
              plan_of: Callable[[int], kernels.LoRAPlan]) -> None:
        entry = self.entries.get((layer, kind))
        if entry is None:
            return
        a_t, expands, layout = entry
        plan = plan_of(layout)
        s = kernels.lora_shrink(x, a_t, plan)
        for offset, n_out, c0, c1, b in expands:
            out = y if n_out == y.shape[1] else y[:, offset : offset + n_out]
            kernels.lora_expand(s if c1 - c0 == s.shape[1] else s[:, c0:c1], b, out, plan, c0)

    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + sum(e[4].numel() * e[4].element_size() for e in ex)
                   for a, ex, _ in self.entries.values())


class LoRASet:
    """Adapters with their scales, applied to every row of a batch (a LoRAApply; `set_loras`'s meaning)."""

    def __init__(self, model, adapters: list[LoRA], scales: list[float]):
        self.adapters = list(adapters)
        self.scales = list(scales)
        pairs = combine(zip(self.adapters, self.scales))
        self.stack = LoRAStack(model, [lora for lora, _ in pairs])
        self._plans = self.stack.plans(torch.tensor([[s for _, s in pairs]], dtype=torch.float32), None)

    @classmethod
    def build(cls, model, loras: Any, scales: float | Iterable[float] | None = None) -> "LoRASet | None":
        """A LoRASet from a LoRA, a path, or a list of them (None or [] -> None: no adapters)."""
        items = adapter_list(loras)
        if not items:
            if scales is not None and not (isinstance(scales, (list, tuple)) and not scales):
                raise ValueError("scales were given but no LoRA adapters")
            return None
        adapters = [item if isinstance(item, LoRA) else LoRA.load(item, model) for item in items]
        return cls(model, adapters, scale_list(scales, len(adapters)))

    def identity(self) -> tuple | None:
        """The page table's identity of this set (adapter_identity)."""
        return adapter_identity(zip(self.adapters, self.scales))

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y += scale * (x @ A^T) @ (alpha/r * B)^T for every adapter on this layer's `kind` linear, in place."""
        self.stack.apply(layer, kind, x, y, self._plans.__getitem__)

    def __repr__(self) -> str:
        return "LoRASet(" + ", ".join(f"{a.name}*{s:g}" for a, s in zip(self.adapters, self.scales)) + ")"


def adapter_list(loras: Any) -> list:
    """A LoRA, a path, or a list of them, as a list (None -> []); anything else is a TypeError."""
    if loras is None:
        return []
    if isinstance(loras, (LoRA, str, Path)):
        return [loras]
    if isinstance(loras, (list, tuple)):
        for item in loras:
            if not isinstance(item, (LoRA, str, Path)):
                raise TypeError(f"each LoRA must be a LoRA or a path, not {type(item).__name__}")
        return list(loras)
    raise TypeError(f"loras must be a LoRA, a path, a list of them or None, not {type(loras).__name__}")


# ---------------------------------------------------------------- helpers

def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - corrupt files surface as one clear error
        raise ValueError(f"cannot read LoRA weights {str(path)!r}: {exc}") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{str(path)!r} does not hold a state dict of tensors")
    return state


def _check_config(config: dict, where: str) -> tuple[int, float, bool]:
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"{where} is a {peft_type} adapter; only LoRA (peft_type LORA) is supported")
    bias = config.get("bias", "none")
    if bias != "none":
        raise ValueError(f"{where} trains biases (bias={bias!r}); only bias='none' is supported")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise ValueError(f"{where} uses {what}, which is not supported")
    targets = config.get("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    for t in names:
        if t != "all-linear" and re.fullmatch(r"[\w.]*", t) and t.split(".")[-1] not in MODULES:
            raise ValueError(f"{where} targets {t!r}; supported target modules: {', '.join(MODULES)}")
    try:
        rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: adapter_config.json needs an integer 'r' and a numeric 'lora_alpha'") from None
    if rank <= 0:
        raise ValueError(f"{where}: r must be positive, got {rank}")
    return rank, alpha, bool(config.get("use_rslora", False))


def _pattern_value(pattern: dict | None, module_key: str, default: float) -> float:
    """PEFT's rank_pattern/alpha_pattern lookup: the first key matching the end of the module's name."""
    for key, value in (pattern or {}).items():
        if re.match(rf"(.*\.)?({key})$", module_key):
            return value
    return default


def scale_list(scales: float | Iterable[float] | None, n: int) -> list[float]:
    if scales is None:
        values = [1.0] * n
    elif isinstance(scales, (int, float)) and not isinstance(scales, bool):
        values = [float(scales)] * n
    else:
        values = list(scales)
        if len(values) != n:
            raise ValueError(f"got {len(values)} LoRA scales for {n} adapters")
    return [check_lora_scale(s) for s in values]
