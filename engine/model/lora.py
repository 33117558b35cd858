"""LoRA adapters in PEFT's on-disk format, applied on the fly as low-rank updates after each fused linear.

Why not merge them into the weights: swapping adapters must be instant, the base weights stay shared and
untouched, and several adapters with their own scales can be active at once. The cost stays small because
every adapter's A matrices for one fused linear (q|k|v, o, gate|up, down) are stacked into one (in, R)
matrix and their scaled B matrices into one block-sparse (R, out) matrix: each hook is two thin matmuls
however many adapters are active.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol

import torch

from ..contract.paths import ADAPTER_CONFIG_FILE as CONFIG_FILE
from ..contract.paths import ADAPTER_WEIGHT_FILES as WEIGHT_FILES

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KINDS = ("qkv", "o", "gate_up", "down")
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

    def fused_out(self, kind: str) -> int:
        return {"qkv": self.q_size + 2 * self.kv_size, "o": self.hidden, "gate_up": 2 * self.intermediate,
                "down": self.hidden}[kind]


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
    LoRASet applies one adapter set to every row. Per-job adapters (Punica-style: each sequence of the batch
    its own set) fit the same call: an object holding several stacks and the batch's row ranges per set.
    """

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> None: ...


class LoRASet:
    """Adapters with their scales, stacked per (layer, fused linear); a LoRAApply for every row of a batch."""

    def __init__(self, model, adapters: list[LoRA], scales: list[float]):
        geometry = Geometry.of(model)
        for lora in adapters:
            if lora.geometry != geometry:
                raise ValueError(f"LoRA adapter {lora.name!r} was loaded for a different model "
                                 f"({lora.geometry} vs {geometry})")
        self.adapters = list(adapters)
        self.scales = list(scales)
        self._stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        parts: dict[tuple[int, str], list] = {}
        for lora, scale in zip(self.adapters, self.scales):
            for (layer, module), (a, b, scaling) in lora.weights.items():
                kind, _, n_out, offset = geometry.module(module)
                parts.setdefault((layer, kind), []).append((a, b, scaling * scale, offset, n_out))
        for (layer, kind), items in parts.items():
            rank_total = sum(a.shape[0] for a, *_ in items)
            a_t = torch.empty(items[0][0].shape[1], rank_total, device=model.device, dtype=model.dtype)
            b_t = torch.zeros(rank_total, geometry.fused_out(kind), device=model.device, dtype=model.dtype)
            row = 0
            for a, b, s, offset, n_out in items:
                r = a.shape[0]
                a_t[:, row : row + r] = a.to(model.device, model.dtype).t()
                b_t[row : row + r, offset : offset + n_out] = (b.float().t() * s).to(model.dtype)
                row += r
            self._stacks[(layer, kind)] = (a_t, b_t)

    @classmethod
    def build(cls, model, loras: Any, scales: float | Iterable[float] | None = None) -> "LoRASet | None":
        """A LoRASet from a LoRA, a path, or a list of them (None or [] -> None: no adapters)."""
        if loras is None:
            items: list = []
        elif isinstance(loras, (LoRA, str, Path)):
            items = [loras]
        elif isinstance(loras, (list, tuple)):
            items = list(loras)
        else:
            raise TypeError(f"loras must be a LoRA, a path, a list of them or None, not {type(loras).__name__}")
        if not items:
            if scales is not None and not (isinstance(scales, (list, tuple)) and not scales):
                raise ValueError("scales were given but no LoRA adapters")
            return None
        adapters = []
        for item in items:
            if isinstance(item, LoRA):
                adapters.append(item)
            elif isinstance(item, (str, Path)):
                adapters.append(LoRA.load(item, model))
            else:
                raise TypeError(f"each LoRA must be a LoRA or a path, not {type(item).__name__}")
        return cls(model, adapters, _scales(scales, len(adapters)))

    def identity(self) -> tuple:
        """Hashable, repr-stable identity for the page table's root hash: K/V depends on all of it."""
        return tuple((a.name, str(a.path) if a.path else "", a.content_hash, s)
                     for a, s in zip(self.adapters, self.scales))

    def add(self, layer: int, kind: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y += x @ A^T @ (scale * B)^T for every active adapter on this layer's `kind` linear, in place."""
        stack = self._stacks.get((layer, kind))
        if stack is not None:
            a_t, b_t = stack
            y.addmm_(x @ a_t, b_t)

    def __repr__(self) -> str:
        return "LoRASet(" + ", ".join(f"{a.name}*{s:g}" for a, s in zip(self.adapters, self.scales)) + ")"


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


def _scales(scales: float | Iterable[float] | None, n: int) -> list[float]:
    if scales is None:
        values = [1.0] * n
    elif isinstance(scales, (int, float)) and not isinstance(scales, bool):
        values = [float(scales)] * n
    else:
        values = list(scales)
        if len(values) != n:
            raise ValueError(f"got {len(values)} LoRA scales for {n} adapters")
    out = []
    for s in values:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise ValueError(f"LoRA scales must be finite numbers, got {s!r}")
        out.append(float(s))
    return out
