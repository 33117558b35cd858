"""llama.cpp (llama-cpp-python) as an oracle, run in a process of its own: quantize a GGUF with llama.cpp's
own quantizer, teacher-forced logits of token ids, and tokenization of text.
`python -m tests.oracles.llamacpp_peer JOBS.json RESULTS.json`.

Its native library has crashed when loaded beside the test suite's others, so the suite writes a list of
jobs and runs them all here in one subprocess (run_jobs): a crash fails the tests that asked for it, and
one process start serves many files. Jobs (dicts, "op" naming the kind):
  * {"op": "quantize", "src", "dst", "type"}: every 2-D tensor of the F32 GGUF `src` becomes ggml type
    `type` through ggml_quantize_chunk, the function llama-quantize calls for each tensor (the imatrix-only
    types get a uniform importance matrix); the rest (norms, rope factors) and all metadata are copied. A
    "pure" recipe: one type for every matrix, so a file tests exactly that type.
  * {"op": "logits", "model", "ids", "out"}: llama.cpp's logits of every position, one llama_decode of
    the whole sequence, saved to the .npy `out`.
  * {"op": "tokenize", "model", "texts", "add_bos", "special"}: Llama(vocab_only=True).tokenize of each.
Each job's result is {"ok": true, ...} or {"ok": false, "error": "..."}.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

THREADS = 2
ROOT = Path(__file__).resolve().parents[2]


def _ggml():
    """The ggml library llama_cpp ships (its quantizer), with the two functions used typed."""
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml.so", "libggml-base.dylib", "libggml.dylib", "ggml-base.dll", "ggml.dll"):
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            break
    else:
        raise FileNotFoundError(f"no ggml library in {lib_dir}")
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    return lib


def quantize_matrix(lib, data: np.ndarray, qtype) -> np.ndarray:
    """(rows, n) float32 -> (rows, bytes per row) uint8 in ggml type `qtype`, by llama.cpp's quantizer."""
    from gguf import GGML_QUANT_SIZES

    data = np.ascontiguousarray(data, dtype=np.float32)
    rows, n = data.shape
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    out = np.zeros((rows, n // block * block_bytes), dtype=np.uint8)
    imatrix = np.ones(n, dtype=np.float32) if lib.ggml_quantize_requires_imatrix(int(qtype)) else None
    written = lib.ggml_quantize_chunk(int(qtype), data.ctypes.data, out.ctypes.data, 0, rows, n,
                                      imatrix.ctypes.data if imatrix is not None else None)
    if written != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes for {qtype.name}, expected {out.nbytes}")
    return out


def quantize_gguf(src: str | Path, dst: str | Path, type_name: str) -> dict:
    """Copy the F32 GGUF `src` to `dst` with every 2-D tensor in ggml type `type_name` (module docstring)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    lib = _ggml()
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), arch=str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    types = {}
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F32 and data.ndim == 2:
            writer.add_tensor(t.name, quantize_matrix(lib, data, qtype), raw_dtype=qtype)
            types[t.name] = type_name
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
            types[t.name] = t.tensor_type.name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"types": types}


def _quiet(llama_cpp):
    """Silence llama.cpp's log (the callback object must outlive the process's use of it)."""
    cb = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(cb, ctypes.c_void_p())
    return cb


def logits(model: str | Path, ids: list[int], out: str | Path) -> dict:
    """llama.cpp's (n, vocab) logits of one teacher-forced sequence, saved as float32 .npy."""
    import llama_cpp

    peer = llama_cpp.Llama(str(model), n_ctx=max(64, len(ids) + 8), n_batch=max(64, len(ids)),
                           n_threads=THREADS, n_threads_batch=THREADS, logits_all=True, verbose=False)
    try:
        peer.eval(ids)
        np.save(out, np.asarray(peer.scores[: len(ids)], dtype=np.float32))
    finally:
        peer.close()
    return {}


def tokenize(model: str | Path, texts: list[str], add_bos: bool, special: bool) -> dict:
    import llama_cpp

    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    try:
        return {"ids": [vocab.tokenize(t.encode("utf-8"), add_bos=add_bos, special=special) for t in texts]}
    finally:
        vocab.close()


_OPS = {"quantize": lambda j: quantize_gguf(j["src"], j["dst"], j["type"]),
        "logits": lambda j: logits(j["model"], j["ids"], j["out"]),
        "tokenize": lambda j: tokenize(j["model"], j["texts"], j.get("add_bos", False), j.get("special", False))}


def run_in_process(jobs: list[dict]) -> list[dict]:
    import llama_cpp

    keep = _quiet(llama_cpp)
    results = []
    for job in jobs:
        try:
            results.append({"ok": True, **_OPS[job["op"]](job)})
        except Exception as e:  # one bad file is that job's failure, not the others'
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    del keep
    return results


def run_jobs(jobs: list[dict], work: str | Path, timeout: float = 600) -> list[dict]:
    """Run `jobs` in one subprocess (module docstring); raises RuntimeError with its stderr if it dies."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    src, dst = work / "llamacpp_jobs.json", work / "llamacpp_results.json"
    src.write_text(json.dumps(jobs))
    dst.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "tests.oracles.llamacpp_peer", str(src), str(dst)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not dst.exists():
        raise RuntimeError(f"llama.cpp subprocess failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(dst.read_text())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__)
        return 2
    jobs = json.loads(Path(args[0]).read_text())
    Path(args[1]).write_text(json.dumps(run_in_process(jobs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
