"""Every environment variable pagedeck defines, in one table (vLLM's envs.py shape): name, type, default,
meaning, and the modules that read it.

Code reads a variable as an attribute of this module (`envs.PAGEDECK_DENSE_COPY`), never from os.environ
itself, so each switch has one parser, one default and one line of documentation, and
tests/engine/test_envs.py fails on a read anywhere else or a name missing here. A value is read from the
environment on its first use and kept for the process: later reads are a plain module attribute (the packed
matmul reads two on every call), and the C++ kernels get theirs once, when the extension loads
(kernels/cpu_ext.py), never per call. `refresh()` forgets the kept values so that code which changes the
environment inside one process (a test's monkeypatch.setenv after the value was read, a tool that points
the app's settings elsewhere) is read again; a child process reads its own.

Standard library only: the app (which never loads torch) and the kernels (which never import the rest of the
engine) read it too. `python -m engine.envs --markdown` prints the table; docs/reference/environment.md is
that output, and a test keeps the two equal.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the typed values, for type checkers and readers; at run time __getattr__ gives them
    PAGEDECK_SETTINGS: Path | None
    PAGEDECK_API_KEY: str | None
    PAGEDECK_DENSE_COPY: str
    PAGEDECK_HUGE_PAGES: bool
    PAGEDECK_MAPPED_START: bool
    PAGEDECK_TOKENIZER_CACHE: Path | bool | None
    PAGEDECK_CPU_KERNELS: bool
    PAGEDECK_CPU_ISA: str
    PAGEDECK_ROW_GROUPS: bool
    PAGEDECK_QGEMM_ROWS: int | None
    PAGEDECK_ROW_CHUNK: int | None
    PAGEDECK_BENCH_CACHE: Path | None
    PAGEDECK_VLLM_URL: str | None
    PAGEDECK_TRITON_NATIVE: bool
    PAGEDECK_TEST_FIRST_START: bool
    PAGEDECK_SOAK_REPLIES: int | None
    PAGEDECK_SOAK_RELOAD_EVERY: int
    PAGEDECK_SOAK_ROTATE: int | None
    PAGEDECK_SOAK_WATCH: str | None
    PAGEDECK_SOAK_SWITCH_INTERVAL: float | None

PREFIX = "PAGEDECK_"  # every variable pagedeck defines starts so; other names are other programs' (HF_HOME...)


@dataclass(frozen=True)
class Var:
    """One variable: `parse` turns its raw value (None when unset) into the typed value code sees."""

    name: str
    type: str
    default: str
    meaning: str
    readers: tuple[str, ...]
    parse: Callable[[str | None], Any]


def _text(raw: str | None) -> str | None:
    """The value, or None when unset or empty (an empty variable means the default, as in a shell's `X= cmd`)."""
    return raw if raw else None


def _path(raw: str | None) -> Path | None:
    return Path(raw) if raw else None


def _on_unless_0(raw: str | None) -> bool:
    return raw is None or raw.strip() != "0"


def _on_if_1(raw: str | None) -> bool:
    return raw is not None and raw.strip() == "1"


def _number(kind: type, default: Any = None) -> Callable[[str | None], Any]:
    def parse(raw: str | None) -> Any:
        if raw is None or not raw.strip():
            return default
        try:
            return kind(raw.strip())
        except ValueError:
            raise ValueError(f"not {'an integer' if kind is int else 'a number'}: {raw!r}") from None
    return parse


def _dense_copy(raw: str | None) -> str:
    value = (raw or "").strip().lower()
    if value in ("0", "off", "no", "false"):
        return "off"
    return "keep" if value in ("1", "keep", "on", "yes", "true") else "auto"


def _path_or_off(raw: str | None) -> Path | bool | None:
    """None when unset (the default place), False for 0 (off), else the path."""
    if not raw:
        return None
    return False if raw.strip() == "0" else Path(raw)


def _cpu_isa(raw: str | None) -> str:
    value = (raw or "").strip()
    return value if value in ("avx2", "avx512") else "native"


VARIABLES: dict[str, Var] = {v.name: v for v in [
    # the app
    Var("PAGEDECK_SETTINGS", "path", "the user config folder's pagedeck.ini",
        "the app's preferences file; its folder also holds the MCP server config (tests and tools point it "
        "into a scratch folder)", ("app.preferences.preferences", "app.agent.mcp_config"), _path),
    # the server
    Var("PAGEDECK_API_KEY", "str", "none (no key)",
        "`python -m engine serve`'s default --api-key: /v1 routes then need 'Authorization: Bearer KEY'",
        ("engine.server.main",), _text),
    # loading a model
    Var("PAGEDECK_DENSE_COPY", "auto / off / keep", "auto",
        "dense weights for prompt rows: off (0/off/no/false) never, keep (1/keep/on/yes/true) a small model "
        "keeps its fp32 copy, auto (unset or anything else) engine.model.packing.repack's rule",
        ("engine.model.packing.repack",), _dense_copy),
    Var("PAGEDECK_HUGE_PAGES", "flag (0: off)", "on",
        "0 keeps loaded weights on 4 KB pages (no MADV_COLLAPSE to 2 MB pages)", ("engine.model.huge_pages",),
        _on_unless_0),
    Var("PAGEDECK_MAPPED_START", "flag (0: off)", "on",
        "0 makes a GGUF's load copy its weights into their kernel layouts before the model is used, instead of "
        "starting on the mapped file while they move in the background", ("engine.model.gguf.weights",), _on_unless_0),
    Var("PAGEDECK_TOKENIZER_CACHE", "path, or 0 (off)", "the user cache's pagedeck/tokenizers folder",
        "where the BPE merges recovered from a SentencePiece GGUF's vocabulary are kept between loads (one "
        "checked entry per file version); 0 recovers them on every load",
        ("engine.model.tokenizer.merge_cache",), _path_or_off),
    # the CPU kernels
    Var("PAGEDECK_CPU_KERNELS", "flag (0: off)", "on",
        "0 turns pagedeck's C++ CPU kernels off (nothing is built or loaded; torch's kernels run instead)",
        ("kernels.cpu_ext",), _on_unless_0),
    Var("PAGEDECK_CPU_ISA", "native / avx2 / avx512", "native",
        "avx2 builds the CPU kernels without AVX-512 and VNNI even where the CPU has them, avx512 without "
        "AVX512-VBMI's byte permutes (tests run every kernel path on one machine)", ("kernels.cpu_ext",), _cpu_isa),
    Var("PAGEDECK_ROW_GROUPS", "flag (0: off)", "on",
        "0 keeps Q4_K matrices in rows instead of 16-row groups (benchmarks comparing the two)",
        ("kernels.packed",), _on_unless_0),
    Var("PAGEDECK_QGEMM_ROWS", "int", "per format: 1024 for q5k16, 256 for iq4xs16, 64 for q6k16, 32 for q4k and q4k16, 12 for q5k and iq4xs, 5 for q4 and q8 rows of K <= 2048, 8 for the others",
        "activation rows from which a packed matmul takes the GEMM path instead of the per-row one, for every "
        "format; given to the C++ kernels when they load (kernels.cpu_ext.set_tuning overrides it in-process)",
        ("kernels.cpu_ext",), _number(int)),
    Var("PAGEDECK_ROW_CHUNK", "int", "~512 KB of weights a chunk, >= 4 chunks a thread; 8 rows for M > 1",
        "output rows per work chunk of the per-row packed matmul (0: one range per thread); given to the C++ "
        "kernels when they load (kernels.cpu_ext.set_tuning overrides it in-process)", ("kernels.cpu_ext",),
        _number(int)),
    # tools and tests
    Var("PAGEDECK_BENCH_CACHE", "path", "the user cache's pagedeck-bench folder",
        "where the big-model benchmarks keep the synthetic GGUF files they build", ("tools.bench.bench_big",), _path),
    Var("PAGEDECK_VLLM_URL", "str", "none (tests/integration is skipped)",
        "a running vLLM server's URL for tests/integration (`make test-vllm` starts one and sets it)",
        ("tests.integration.conftest", "tests.integration.test_remote_vllm",
         "tests.integration.test_remote_vllm_tools"), _text),
    Var("PAGEDECK_TRITON_NATIVE", "flag (1: on)", "off",
        "1 runs the tests' Triton kernels compiled for the GPU instead of in Triton's CPU interpreter "
        "(tools/bench/gpu_check.sh sets it)", ("tests.conftest",), _on_if_1),
    Var("PAGEDECK_TEST_FIRST_START", "flag (1: on)", "off",
        "1 runs the first-start test, a real kernel compile into an empty cache (`make test-first-start`)",
        ("tests.app.test_first_start",), _on_if_1),
    Var("PAGEDECK_SOAK_REPLIES", "int", "none: a short run of 24 replies",
        "replies of the app soak test; set, it is the full soak (`make soak-app`: 500)",
        ("tests.app.test_app_soak",), _number(int)),
    Var("PAGEDECK_SOAK_RELOAD_EVERY", "int", "150", "replies between the app soak's model reloads",
        ("tests.app.test_app_soak",), _number(int, 150)),
    Var("PAGEDECK_SOAK_ROTATE", "int", "4 in the full soak, else 0",
        "the soak replaces each chat by a fresh one after this many replies of its own (0: never)",
        ("tests.app.test_app_soak",), _number(int)),
    Var("PAGEDECK_SOAK_WATCH", "str", "none (off)",
        "set, the soak records what the Qt thread did in each late tick; a value ending .json is the file "
        "every gap is written to", ("tests.app.test_app_soak",), _text),
    Var("PAGEDECK_SOAK_SWITCH_INTERVAL", "float", "none (the app's 1 ms)",
        "the soak's GIL switch interval in seconds (to compare intervals)", ("tests.app.test_app_soak",),
        _number(float)),
]}

_kept: set[str] = set()  # the variables read so far (their values are module attributes)


def _read(name: str) -> Any:
    try:
        value = VARIABLES[name].parse(os.environ.get(name))
    except ValueError as e:
        raise ValueError(f"environment variable {name}: {e}") from None
    globals()[name] = value  # later reads are a plain attribute lookup, not this function
    _kept.add(name)
    return value


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return _read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(VARIABLES))


def refresh(*names: str) -> None:
    """Forget the kept values of `names` (all when none is given): the next read takes the environment's."""
    for name in names or list(_kept):
        if name not in VARIABLES:
            raise KeyError(name)
        _kept.discard(name)
        globals().pop(name, None)


def markdown() -> str:
    """The table as the Markdown page docs/reference/environment.md."""
    lines = ["# Environment variables", "",
             "<!-- generated by `python -m engine.envs --markdown` from engine/envs.py: edit that, not this page -->",
             "",
             "Every environment variable pagedeck defines. Each is read once, on first use, by engine/envs.py "
             "(the one place that reads them); an empty value counts as unset.", "",
             "| variable | type | default | meaning | read by |", "| --- | --- | --- | --- | --- |"]
    for v in VARIABLES.values():
        readers = ", ".join(f"`{r}`" for r in v.readers)
        lines.append(f"| `{v.name}` | {v.type} | {v.default} | {v.meaning} | {readers} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.envs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true",
                        help="print the table as Markdown (else: each variable's value here)")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(), end="")
    else:
        for name in VARIABLES:
            print(f"{name} = {__getattr__(name)!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
