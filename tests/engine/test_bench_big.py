"""tools.bench.bench_big's cache: a file is built once and reused, and one built elsewhere with the same
parameters is copied rather than rebuilt (building the big ones takes minutes)."""

import filecmp

import pytest

import tools.models.synthetic_gguf
from tools.bench import bench_big


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDECK_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bench_big, "FILES", {"tiny-2L": dict(shape="tiny", layers=2),
                                             "tiny-tied": dict(shape="tiny", layers=2, tied=True)})
    monkeypatch.setattr(bench_big, "ELSEWHERE", [tmp_path / "elsewhere"])
    return tmp_path


def _no_build(*a, **k):
    raise AssertionError("rebuilt a file the cache or another folder already had")


def test_built_once_then_reused(tiny, monkeypatch):
    path = bench_big.build("tiny-2L")
    assert path.parent == tiny / "cache" and path.is_file()
    monkeypatch.setattr(tools.models.synthetic_gguf, "write_random_gguf", _no_build)
    assert bench_big.build("tiny-2L") == path


def test_an_identical_file_elsewhere_is_copied(tiny, monkeypatch):
    other = tools.models.synthetic_gguf.write_random_gguf(tiny / "elsewhere" / "tiny-2L.gguf", "tiny", 2, "Q4_K_M")
    tools.models.synthetic_gguf.write_random_gguf(tiny / "elsewhere" / "tiny-tied.gguf", "tiny", 2, "Q4_K_M")  # untied
    built = []
    real = tools.models.synthetic_gguf.write_random_gguf
    monkeypatch.setattr(tools.models.synthetic_gguf, "write_random_gguf", lambda *a, **k: built.append(a) or real(*a, **k))
    assert filecmp.cmp(bench_big.build("tiny-2L"), other, shallow=False) and not built
    bench_big.build("tiny-tied")  # different parameters (its head is tied): built, not copied
    assert len(built) == 1
