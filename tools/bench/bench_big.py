"""The synthetic GGUF files the speed goals are measured on, built once into a cache outside the tree:
`python -m tools.bench.bench_big build [NAME ...]` prints their paths (`make bench-big` then benchmarks each).

Files: Llama-3-8B shapes with 8 and with all 32 layers, and a Llama-3.2-3B-shaped one (28 layers, a
128,256-token vocabulary, tied head), all llama.cpp's Q4_K_M recipe with random weights (tools.models.synthetic_gguf,
seed 0: the same parameters always give the same bytes). A file already in the cache is reused; one already
built elsewhere with the same parameters (e.g. /tmp/ggufmem/llama3-8b-8L.gguf) is copied instead of rebuilt.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import platformdirs

from engine import envs

FILES: dict[str, dict] = {
    "llama3-8b-8L": dict(shape="llama3-8b", layers=8),
    "llama3-8b-32L": dict(shape="llama3-8b", layers=32),
    "llama3.2-3b": dict(shape="llama3.2-3b", layers=28, vocab=128256, pad_vocab=True, tied=True),
}
ELSEWHERE = [Path("/tmp/ggufmem")]  # where earlier sessions built some of them


def cache_dir() -> Path:
    """PAGEDECK_BENCH_CACHE, else the user cache (~/.cache/pagedeck-bench on Linux)."""
    return envs.PAGEDECK_BENCH_CACHE or Path(platformdirs.user_cache_dir("pagedeck-bench"))


def _params(name: str) -> dict:
    return {"quant": "Q4_K_M", "seed": 0, **FILES[name]}


def _same_parameters(path: Path, name: str) -> bool:
    """A file built elsewhere by tools.models.synthetic_gguf with this name's shape, layers, vocabulary and head."""
    from engine.model.gguf.file import GGUFFile

    p = _params(name)
    try:
        gf = GGUFFile(path, header_only=True)
    except ValueError:
        return False
    meta, names = gf.metadata, {t.name for t in gf.tensors}
    gf.close()
    return (meta.get("general.name") == f"random {p['shape']} ({p['layers']} layers, {p['quant']})"
            and meta.get("llama.vocab_size") == p.get("vocab", meta.get("llama.vocab_size"))
            and ("output.weight" not in names) == p.get("tied", False))


def build(name: str, log=print) -> Path:
    """The cached file of `name`, built (or copied from an identical one) where missing."""
    out = cache_dir() / f"{name}.gguf"
    stamp = out.with_suffix(".json")
    if out.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == _params(name):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    for other in (d / f"{name}.gguf" for d in ELSEWHERE):
        if other.is_file() and _same_parameters(other, name):
            log(f"copying {other} -> {out}")
            shutil.copyfile(other, tmp)
            break
    else:
        from tools.models.synthetic_gguf import write_random_gguf

        log(f"building {out} (minutes)")
        write_random_gguf(tmp, quant="Q4_K_M", seed=0, **FILES[name])
    tmp.replace(out)
    stamp.write_text(json.dumps(_params(name)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["build", "dir"])
    ap.add_argument("names", nargs="*", help=f"which files (default: all): {', '.join(FILES)}")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in FILES]
    if unknown:
        ap.error(f"unknown file {unknown[0]!r}; known: {', '.join(FILES)}")
    if args.command == "dir":
        print(cache_dir())
        return 0
    for name in args.names or FILES:
        print(build(name, log=lambda m: print(m, flush=True, file=sys.stderr)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
