"""What counts as a model or a LoRA adapter on disk, decided here once for the CLI, the app and the loaders."""
from __future__ import annotations

from pathlib import Path


def model_path_problem(path: str | Path) -> str | None:
    """Why `path` can't be a model, or None: a model is a .gguf file or a Hugging Face folder with config.json."""
    p = Path(path).expanduser()
    if not p.exists():
        return f"model path does not exist: {path}"
    if p.is_dir():
        return None if (p / "config.json").is_file() else f"not a Hugging Face model folder (no config.json): {p}"
    return None if is_gguf(p) else f"{p} is neither a Hugging Face model folder nor a .gguf file"


def is_gguf(path: str | Path) -> bool:
    """A .gguf file, or any file starting with GGUF's magic (Ollama's blobs have no suffix)."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def check_model_path(path: str | Path) -> Path:
    """`path` (user-expanded) if it can be a model; else FileNotFoundError (missing path or config.json) or
    ValueError (some other file), saying which."""
    problem = model_path_problem(path)
    if problem is not None:
        p = Path(path).expanduser()
        raise (ValueError if p.is_file() else FileNotFoundError)(problem)
    return Path(path).expanduser()


ADAPTER_CONFIG_FILE = "adapter_config.json"  # PEFT's files
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def is_adapter_dir(path: str | Path) -> bool:
    """A folder that claims to be a PEFT adapter: it holds adapter_config.json (missing or broken weights are
    that adapter's problem to report, not a reason to hide it)."""
    return (Path(path) / ADAPTER_CONFIG_FILE).is_file()


def find_adapters(*folders: str | Path) -> list[Path]:
    """Adapter folders among the given folders: each one that is an adapter itself, else its immediate
    sub-folders that are, sorted."""
    found = []
    for folder in folders:
        folder = Path(folder)
        if is_adapter_dir(folder):
            found.append(folder)
        elif folder.is_dir():
            found += sorted(p for p in folder.iterdir() if is_adapter_dir(p))
    return found


def resources_folder() -> Path:
    """resources/ beside the packages: the checkout's, or the installed wheel's (pyproject ships it)."""
    return Path(__file__).resolve().parents[2] / "resources"


def demo_adapters_folder() -> Path:
    """resources/loras/: the demo adapters made by tools/models/train_lora.py (`python -m tools.models.train_lora`)."""
    return resources_folder() / "loras"
