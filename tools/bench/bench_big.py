"""The synthetic GGUF files the speed goals are measured on, built once into a cache outside the tree:
`python -m tools.bench.bench_big build [NAME ...]` prints their paths (`make bench-big` then benchmarks each).

Files: three real models' architectures and shapes, Qwen2.5-1.5B, Gemma-3-270M and Llama-3.2-3B
(tools.models._llamacpp_quantized.PRESETS: all their layers, their real-size vocabularies and heads), written
F16 with random weights and quantized to Q4_K_M by llama.cpp's own quantizer, so each holds llama.cpp's
per-layer mix (BIG: what `make bench-big` measures); and Llama-3-8B shapes with 8 and with all 32 layers,
Q4_K_M by our writers (tools.models.synthetic_gguf's copy of the recipe, the SmolLM2 vocabulary). Seed 0: the
same parameters always give the same weights. A file already in the cache is reused; one of our writers'
already built elsewhere with the same parameters (e.g. /tmp/ggufmem/llama3-8b-8L.gguf) is copied instead.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import platformdirs

from engine import envs

FILES: dict[str, dict] = {  # "preset": llama.cpp's quantizer on that preset, its fields overridden by the rest
    "qwen2.5-1.5b": dict(preset="qwen2.5-1.5b"),
    "gemma3-270m": dict(preset="gemma3-270m"),
    "llama3.2-3b": dict(preset="llama3.2-3b"),
    "llama3-8b-8L": dict(shape="llama3-8b", layers=8),
    "llama3-8b-32L": dict(shape="llama3-8b", layers=32),
    # the whole pipeline in a minute: a 2-layer Qwen 2 with small rows and the SmolLM2 vocabulary
    "smoke": dict(preset="qwen2.5-1.5b", layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab=49152, tokenizer="smollm2"),
}
BIG = ("qwen2.5-1.5b", "gemma3-270m", "llama3.2-3b")
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


def _write(path: Path, name: str) -> None:
    if "preset" in FILES[name]:
        from engine.model.gguf.file import GGUFFile
        from engine.model.weights import default_model_path
        from tools.models._llamacpp_quantized import PRESETS, write_quantized_gguf
        from tools.models.synthetic_gguf import smollm2_tokenizer

        p = _params(name)
        model = {**PRESETS[p["preset"]], **{k: v for k, v in p.items() if k not in ("preset", "quant", "seed")}}
        # as `synthetic_gguf OUT --preset P --quantize Q` writes it: SmolLM2's chat template, this name
        write_quantized_gguf(path, model, p["quant"], seed=p["seed"], add_tokenizer=smollm2_tokenizer(model["vocab"]),
                             name=f"random {p['preset']} ({model['layers']} layers, {p['quant']} by llama.cpp)",
                             chat_template=GGUFFile(default_model_path()).metadata["tokenizer.chat_template"])
    else:
        from tools.models.synthetic_gguf import write_random_gguf

        write_random_gguf(path, quant="Q4_K_M", seed=0, **FILES[name])


def build(name: str, log=print) -> Path:
    """The cached file of `name`, built (or copied from an identical one) where missing."""
    out = cache_dir() / f"{name}.gguf"
    stamp = out.with_suffix(".json")
    if out.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == _params(name):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    for other in (d / f"{name}.gguf" for d in ELSEWHERE if "preset" not in FILES[name]):
        if other.is_file() and _same_parameters(other, name):
            log(f"copying {other} -> {out}")
            shutil.copyfile(other, tmp)
            break
    else:
        log(f"building {out} (minutes)")
        _write(tmp, name)
    tmp.replace(out)
    stamp.write_text(json.dumps(_params(name)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["build", "dir"])
    ap.add_argument("names", nargs="*", help=f"which files (default: {', '.join(BIG)}): {', '.join(FILES)}")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in FILES]
    if unknown:
        ap.error(f"unknown file {unknown[0]!r}; known: {', '.join(FILES)}")
    if args.command == "dir":
        print(cache_dir())
        return 0
    for name in args.names or BIG:
        print(build(name, log=lambda m: print(m, flush=True, file=sys.stderr)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
