"""Find the models already on disk: the Hugging Face hub cache, LM Studio's and GPT4All's model folders,
Ollama's blob store (through its manifests) and folders the user added.

Each is described from headers only (engine.model.catalog.info) and given a memory estimate
(engine.model.catalog.memory), so a model list shows architecture, size, quantization and whether it fits, and
greys out what this engine cannot run with the reason. A GGUF with a vision projector beside it
(`mmproj*.gguf` in the same folder, LM Studio's and llama.cpp's layout; an Ollama model's projector layer) is
one that sees images: its `mmproj` names the projector, which is never listed as a model of its own. Qt-free;
the app's model browser is a view of find_models().
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .memory import MemoryEstimate, estimate_memory
from .info import ModelInfo, read_model_info

HF, LMSTUDIO, GPT4ALL, OLLAMA, ADDED = "Hugging Face cache", "LM Studio", "GPT4All", "Ollama", "Added folder"
_OLLAMA_MODEL = "application/vnd.ollama.image.model"
_OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"


@dataclass
class FoundModel:
    path: Path  # what Model.load takes: a .gguf file, an Ollama blob, or an HF folder
    source: str  # where it was found (HF, LMSTUDIO, ...)
    name: str  # as that source names it: "Qwen/Qwen2.5-7B-Instruct", "llama3.2:3b", a file name
    info: ModelInfo
    estimate: MemoryEstimate | None = None
    mmproj: Path | None = None  # the vision projector that goes with it (a model that sees images)

    @property
    def sees_images(self) -> bool:
        """A projector beside a GGUF, or an HF folder whose config has a vision tower."""
        return self.mmproj is not None or _hf_vision(self.path)

    @property
    def supported(self) -> bool:
        return self.info.supported

    @property
    def reason(self) -> str | None:
        return self.info.problem

    @property
    def fits(self) -> bool | None:
        return None if self.estimate is None else self.estimate.fits


def model_locations(env: dict | None = None, home: Path | None = None) -> list[tuple[str, Path]]:
    """(source, folder) pairs where the usual tools keep models, whether or not they exist."""
    env = os.environ if env is None else env
    home = Path(home) if home is not None else Path.home()
    if env.get("HF_HUB_CACHE"):
        hub = Path(env["HF_HUB_CACHE"])
    elif env.get("HF_HOME"):
        hub = Path(env["HF_HOME"]) / "hub"
    else:
        hub = Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "huggingface" / "hub"
    return [
        (HF, hub),
        (LMSTUDIO, home / ".lmstudio" / "models"),
        (LMSTUDIO, home / ".cache" / "lm-studio" / "models"),
        (GPT4ALL, _gpt4all_dir(home)),
        (OLLAMA, Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"),
    ]


def _gpt4all_dir(home: Path) -> Path:
    """GPT4All's default download folder: Qt's app data location, <user data dir>/nomic.ai/GPT4All."""
    import platformdirs

    default = Path(platformdirs.user_data_dir()) / "nomic.ai" / "GPT4All"
    try:  # the same path relative to the home asked for (tests use a fake home)
        return home / default.relative_to(Path.home())
    except ValueError:
        return default


def find_models(extra_folders=(), *, env: dict | None = None, home: Path | None = None, cache_tokens: int = 8192,
                kv_quant: str | None = None, weights: str = "auto", device: str = "cpu") -> list[FoundModel]:
    """Every model found, each described and estimated once (the same file reached twice is listed once)."""
    candidates: list[tuple[str, str, Path]] = []
    projectors: dict[Path, Path] = {}  # an Ollama model blob -> its projector blob
    for source, folder in model_locations(env, home) + [(ADDED, Path(f)) for f in extra_folders]:
        if not folder.is_dir():
            continue
        if source == HF:
            candidates += _hf_cache(folder)
        elif source == OLLAMA:
            candidates += _ollama(folder, projectors)
        else:
            candidates += [(source, name, path) for name, path in _model_files(folder)]
    found, seen = [], set()
    for source, name, path in candidates:
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        info = read_model_info(path)
        if source == OLLAMA and not path.exists():
            info.problem = "its model blob is missing from Ollama's store"
        est = None
        if info.config is not None:
            try:
                est = estimate_memory(info, cache_tokens=cache_tokens, kv_quant=kv_quant, weights=weights, device=device)
            except (ValueError, KeyError) as e:
                info.problem = info.problem or str(e)
        projector = projectors.get(path) if source == OLLAMA else find_mmproj(path)
        found.append(FoundModel(path, source, name, info, est, projector))
    return found


def find_mmproj(model: Path) -> Path | None:
    """The vision projector of a GGUF: an mmproj*.gguf in its folder; of several, the one whose name
    shares the longest start with the model's (mmproj-Qwen2-VL-7B-f16.gguf for Qwen2-VL-7B-Q4_K_M.gguf)."""
    if model.suffix.lower() != ".gguf" or not model.parent.is_dir():
        return None
    found = sorted(p for p in model.parent.glob("*.gguf") if p.name.lower().startswith("mmproj"))
    if len(found) <= 1:
        return found[0] if found else None
    stem = model.name.lower()

    def shared(p: Path) -> int:
        name = re.sub(r"^mmproj[-_.]?(model[-_.]?)?", "", p.name.lower())
        return len(os.path.commonprefix([name, stem]))

    return max(found, key=shared)  # (max keeps the first, in name order, of equals)


def _hf_vision(path: Path) -> bool:
    cfg = path / "config.json"
    if not path.is_dir() or not cfg.is_file():
        return False
    try:
        return "vision_config" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def _model_files(folder: Path):
    """(name, path) of the GGUF files and HF model folders under a folder (LM Studio, GPT4All, added)."""
    for p in sorted(folder.rglob("*.gguf")):
        if p.name.startswith("mmproj") or _later_split_part(p.name):
            continue  # vision projectors and the second..nth parts of split files are not models of their own
        yield str(p.relative_to(folder)), p
    for cfg in sorted(folder.rglob("config.json")):
        if any(cfg.parent.glob("*.safetensors")):
            yield str(cfg.parent.relative_to(folder)) if cfg.parent != folder else folder.name, cfg.parent


_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def _later_split_part(name: str) -> bool:
    """llama.cpp's split files are NAME-0000k-of-0000n.gguf; the first part stands for the model."""
    m = _SPLIT.search(name)
    return m is not None and int(m.group(1)) > 1


def _hf_cache(hub: Path):
    """models--org--name/snapshots/<rev>: the revision refs/main names (else the newest), as an HF folder
    when it has a config.json, plus any GGUF files in it."""
    for repo in sorted(hub.glob("models--*")):
        name = repo.name.removeprefix("models--").replace("--", "/")
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = repo / "refs" / "main"
        snap = snapshots / ref.read_text().strip() if ref.is_file() else None
        if snap is None or not snap.is_dir():
            revs = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
            if not revs:
                continue
            snap = revs[-1]
        if (snap / "config.json").is_file():
            yield HF, name, snap
        for file_name, path in _model_files(snap):
            if path != snap:
                yield HF, f"{name}/{file_name}", path


def _ollama(root: Path, projectors: dict[Path, Path]):
    """Ollama: manifests/<registry>/<namespace>/<model>/<tag> name the layers; the model layer's digest
    sha256:<hex> is the GGUF at blobs/sha256-<hex>."""
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            layers = json.loads(manifest.read_text()).get("layers", [])
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        digest = next((layer.get("digest") for layer in layers if layer.get("mediaType") == _OLLAMA_MODEL), None)
        if not digest:
            continue
        parts = manifest.relative_to(manifests).parts  # registry, namespace, model, tag
        model = parts[-2] if len(parts) >= 2 else manifest.parent.name
        namespace = parts[-3] if len(parts) >= 3 else "library"
        name = f"{model}:{parts[-1]}" if namespace == "library" else f"{namespace}/{model}:{parts[-1]}"
        blob = root / "blobs" / digest.replace(":", "-")
        projector = next((layer.get("digest") for layer in layers if layer.get("mediaType") == _OLLAMA_PROJECTOR), None)
        if projector:
            projectors[blob] = root / "blobs" / projector.replace(":", "-")
        yield OLLAMA, name, blob
