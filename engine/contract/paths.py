"""What counts as a model on disk, checked the same way by the CLI, the app and the weight loader."""
from __future__ import annotations

from pathlib import Path


def model_path_problem(path: str | Path) -> str | None:
    """Why `path` can't be a model, or None: a model is a .gguf file or a Hugging Face folder with config.json."""
    p = Path(path).expanduser()
    if not p.exists():
        return f"model path does not exist: {path}"
    if p.is_dir():
        return None if (p / "config.json").is_file() else f"not a Hugging Face model folder (no config.json): {p}"
    return None if p.suffix.lower() == ".gguf" else f"{p} is neither a Hugging Face model folder nor a .gguf file"


def check_model_path(path: str | Path) -> Path:
    """`path` (user-expanded) if it can be a model; else FileNotFoundError (missing path or config.json) or
    ValueError (some other file), saying which."""
    problem = model_path_problem(path)
    if problem is not None:
        p = Path(path).expanduser()
        raise (ValueError if p.is_file() else FileNotFoundError)(problem)
    return Path(path).expanduser()
