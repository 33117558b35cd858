"""pagedeck's own CPU kernels (kernels/cpu/*.cpp), compiled for this machine at first use.

torch has no fast CPU matmul for 4/8-bit weights at decode-sized row counts (its int4 kernel wants bf16
activations and runs ~3x below memory bandwidth here, kernels/PERF.md), and a decode step of a small model
is ~40 tiny eager ops per layer. These kernels do integer dot products on packed blocks (as llama.cpp
does) and fuse rotary + K/V write + decode attention into one call per layer.

The extension is built once per source version with torch.utils.cpp_extension (gcc, -march=native; ~40 s
of compiler time) into torch's extension cache (~/.cache/torch_extensions or $TORCH_EXTENSIONS_DIR, never the
tree) and loaded as torch.ops.pagedeck.*. Without a compiler, or with PAGEDECK_CPU_KERNELS=0,
`ops()` returns None and callers use their torch paths. PAGEDECK_CPU_ISA=avx2 builds without AVX-512 and
VNNI even where the CPU has them, =avx512 without AVX512-VBMI (the tests run each path on any machine that
has the wider one). The packed matmul's
two path switches, PAGEDECK_QGEMM_ROWS and PAGEDECK_ROW_CHUNK, go into the extension when it loads (its
set_tuning op): the C++ never reads the environment. The variables are engine.envs's, the one module that
reads pagedeck's environment (stdlib only, so importing it brings no engine code here).

torch guards a build with a lock file in its build folder and waits, silently and forever, while the file
exists; a build that was killed (the app closed or crashed during its first start) leaves it behind. A lock
older than STALE_LOCK_S, far longer than a build takes, is taken as left over and removed, with a warning.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from pathlib import Path

import torch

from engine import envs

SOURCES = [Path(__file__).with_name("cpu") / name for name in (
    "qmatmul.cpp", "attention.cpp", "norm.cpp", "decode.cpp", "repack.cpp", "load_moves.cpp", "dequant.cpp", "moe.cpp")]
# -fopenmp: at::parallel_for is inline OpenMP in torch's headers; without it every kernel ran on one thread
# whatever torch.set_num_threads said (the pragmas compile to nothing). The extension then links libgomp.so.1,
# the soname torch already loaded from torch/lib, so the process keeps one OpenMP runtime.
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
# PAGEDECK_CPU_ISA's narrower builds: what a CPU without AVX-512 and VNNI compiles, and an AVX-512 one without
# VBMI (Skylake-X, Cascade Lake)
NARROWER = {"avx2": ["-mno-avx512f", "-mno-avxvnni"], "avx512": ["-mno-avx512vbmi", "-mno-avx512vbmi2"]}
STALE_LOCK_S = 600.0  # a build takes ~1 min on 2 cores; a lock this old belongs to a build that was killed
_lock = threading.Lock()
_libs: dict = {}  # (PAGEDECK_CPU_KERNELS, PAGEDECK_CPU_ISA) -> the loaded ops, or None
_current: tuple = ((), None)  # (the variables ops() last saw, its answer)
log = logging.getLogger(__name__)


def enabled() -> bool:
    return envs.PAGEDECK_CPU_KERNELS


def ops():
    """torch.ops.pagedeck after building/loading the extension, or None when it is disabled or can't build.
    Called on every packed matmul: the answer is kept while engine.envs's values stay the same (a test's
    envs.refresh() may change them); a changed PAGEDECK_QGEMM_ROWS / PAGEDECK_ROW_CHUNK goes into the kernels."""
    global _current
    key = (envs.PAGEDECK_CPU_KERNELS, envs.PAGEDECK_CPU_ISA, envs.PAGEDECK_QGEMM_ROWS, envs.PAGEDECK_ROW_CHUNK)
    seen, answer = _current
    if seen == key:
        return answer
    with _lock:
        if key[:2] not in _libs:
            _libs[key[:2]] = _load() if key[0] else None
        lib = _libs[key[:2]]
        if lib is not None:
            lib.set_tuning(key[2], key[3])
        _current = (key, lib)
    return lib


def set_tuning(**overrides: int | None) -> None:
    """From now on packed matmuls run with these switches: `qgemm_rows=` in place of PAGEDECK_QGEMM_ROWS (the
    rows from which the GEMM path runs), `row_chunk=` in place of PAGEDECK_ROW_CHUNK (None: the kernels' own
    rule); one not given keeps the environment's, and none given restores both. Benchmarks and tests compare
    the paths in one process this way; both give the same bits, only the time differs."""
    switches = {"qgemm_rows": envs.PAGEDECK_QGEMM_ROWS, "row_chunk": envs.PAGEDECK_ROW_CHUNK}
    if set(overrides) - set(switches):
        raise TypeError(f"unknown switches {sorted(set(overrides) - set(switches))}; known: {sorted(switches)}")
    switches.update(overrides)
    ops().set_tuning(switches["qgemm_rows"], switches["row_chunk"])


@contextlib.contextmanager
def tuning(**overrides: int | None):
    """set_tuning(**overrides) inside the block, the environment's switches after it."""
    set_tuning(**overrides)
    try:
        yield
    finally:
        set_tuning()


def current_tuning() -> tuple[int | None, int | None]:
    """(qgemm_rows, row_chunk) as the kernels hold them now; None: their own rule."""
    unset = -(2 ** 63)  # qmatmul.cpp's kUnset
    return tuple(None if v == unset else v for v in ops().get_tuning())


def cflags() -> list[str]:
    return CFLAGS + NARROWER.get(envs.PAGEDECK_CPU_ISA, [])


def _cpu_flags() -> bytes:
    """What -march=native resolves to: a cache shared by machines with different CPUs must not hand one
    machine another's binary (illegal instructions, or a slower path)."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return b"".join(line for line in f if line.startswith((b"flags", b"model name")))
    except OSError:
        return b""


def build_name() -> str:
    """The extension's name in torch's cache, keyed by the sources' folder, sources, headers, flags and CPU:
    torch rebuilds a name whose sources changed (and ignores headers), and its ninja file names the sources
    by absolute path, so two checkouts sharing one cache (even of identical sources) would rebuild each
    other's build on every start, each taking the build lock in turn; a name per checkout and content lets
    each build once."""
    h = hashlib.sha256(" ".join(cflags()).encode() + _cpu_flags() + str(SOURCES[0].parent.resolve()).encode())
    for path in sorted(SOURCES[0].parent.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + path.read_bytes())
    return "pagedeck_cpu_" + h.hexdigest()[:12]


def build_directory(name: str) -> Path:
    """Where torch.utils.cpp_extension builds extension `name` (its _get_build_directory's rule, without
    importing that module: it pulls in setuptools, ~0.1 s of every start)."""
    import os
    import sys

    from torch import _appdirs

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        accelerator = ("rocm" + torch.version.hip.replace(".", "") if torch.version.hip is not None
                       else "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda is not None else "cpu")
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions")),
                            f"{python}_{accelerator}")
    return Path(root) / name


def _load_built(name: str) -> bool:
    """Load this checkout's build straight from torch's extension cache where it is complete (its name holds
    the sources', flags' and CPU's hash, so a library under it is current) and no build holds the lock;
    False where it must go through torch's loader (build, rebuild or wait)."""
    folder = build_directory(name)
    library = folder / f"{name}.so"
    if not library.is_file() or (folder / "lock").exists():
        return False
    try:
        torch.ops.load_library(str(library))
    except OSError as e:  # an unfinished or foreign file: torch's loader rebuilds it
        log.info("pagedeck's CPU kernels at %s did not load (%s); rebuilding", library, e)
        return False
    return True


def _load():
    try:
        name = build_name()
        if _load_built(name):
            return torch.ops.pagedeck
        from torch.utils.cpp_extension import load

        log.info("loading pagedeck's CPU kernels (compiled once per machine and source change, ~1 min)")
        _wait_for_other_build(name)
        load(name=name, sources=[str(s) for s in SOURCES], is_python_module=False, extra_cflags=cflags(),
             extra_ldflags=LDFLAGS, extra_include_paths=[str(SOURCES[0].parent)], verbose=False)
        return torch.ops.pagedeck
    except Exception as e:  # no compiler, unsupported platform: the torch paths still work
        log.warning("pagedeck CPU kernels unavailable (%s); using torch's kernels", e)
        return None


def _wait_for_other_build(name: str) -> None:
    """Wait while another process builds this extension; remove its lock once it is older than STALE_LOCK_S
    (torch itself would wait on a dead build's lock forever)."""
    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    told = False
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > STALE_LOCK_S:
            log.warning("removing %s: a build of pagedeck's CPU kernels left it %.0f s ago and never finished",
                        lock, age)
            lock.unlink(missing_ok=True)
            return
        if not told:
            log.info("waiting for another process to finish building pagedeck's CPU kernels (%s)", lock)
            told = True
        time.sleep(0.5)


def available() -> bool:
    return ops() is not None


def built() -> bool:
    """Whether this machine's build is in torch's extension cache already, so loading it takes a moment rather
    than a compile (~1 min on 2 cores); True when the kernels are disabled (nothing to build)."""
    if not enabled():
        return True
    name = build_name()
    return (build_directory(name) / f"{name}.so").is_file()


def main() -> int:
    """`python -m kernels.cpu_ext`: build now (make setup does, so the first start loads instead of compiling)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if built():
        print("pagedeck's CPU kernels are already built for this machine")
        return 0
    print("Compiling pagedeck's CPU kernels for this CPU (once, ~1 min)…", flush=True)
    t0 = time.perf_counter()
    ok = available()
    print(f"done in {time.perf_counter() - t0:.0f} s" if ok else "not built: the torch kernels will be used instead")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
