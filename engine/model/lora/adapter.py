"""One LoRA adapter in PEFT's on-disk format (adapter_config.json + adapter_model.safetensors or .bin), read
and validated against a model's shapes: `LoRA` holds each adapted module's A, B and scaling.

Everything PEFT can express that this engine does not compute (DoRA, biases, embeddings, experts, ...) is
refused here by name, so an adapter either loads and means what it meant in PEFT or fails with the reason.
How adapters are applied is engine.model.lora.stack's business.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...contract.paths import ADAPTER_CONFIG_FILE as CONFIG_FILE
from ...contract.paths import ADAPTER_WEIGHT_FILES as WEIGHT_FILES

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

def check_fits(model, lora: LoRA) -> None:
    """A LoRA object loaded for another model's shapes is refused before it reaches a forward."""
    geometry = Geometry.of(model)
    if lora.geometry != geometry:
        raise ValueError(f"LoRA adapter {lora.name!r} was loaded for a different model ({lora.geometry} vs {geometry})")


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
