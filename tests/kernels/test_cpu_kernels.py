"""pagedeck's CPU kernels (kernels/cpu_ext.py) against exact statements of what they compute: the packed
matmuls against a float64 re-statement of their integer arithmetic, fused rotary + K/V write + attention
against the torch reference ops on shuffled pages with NaN in every unwritten slot, the fused RMSNorm
against the reference; and the torch fallbacks when the extension is switched off."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import kernels
from engine.model.qlinear import Q4Linear, Q8Linear
from kernels import cpu_ext
from kernels.packed import q8_unpack, unpack_nibbles
from kernels import reference as ref
from kernels.reference_attention import paged_attention
from tests.kernels.test_oracle import PagedCase

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def assert_rows_independent(w, x: torch.Tensor, singles, span: tuple[int, int] | None = None) -> None:
    """w(x)'s rows do not depend on the call: each row of `singles` alone, the rows [span) together, and the
    whole call on one thread give the bits of the whole call on all threads."""
    together = w(x)
    for i in singles:
        assert torch.equal(w(x[i : i + 1]), together[i : i + 1])
    if span is not None:
        assert torch.equal(w(x[span[0] : span[1]]), together[span[0] : span[1]])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(w(x), together)
    finally:
        torch.set_num_threads(threads)


def random_q4(N: int, K: int, seed: int = 0) -> Q4Linear:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    scale = (torch.rand(N, K // 32, generator=g) * 0.02 + 0.001).half()
    minimum = (-8 * scale.float() + torch.randn(N, K // 32, generator=g) * 0.01).half()  # Q4_1-like offsets
    return Q4Linear(codes, scale, minimum)


def codes(w) -> torch.Tensor:
    """The (N, K) codes of a packed matrix: q4 0..15, q8 int8."""
    return unpack_nibbles(w.qs) if isinstance(w, Q4Linear) else q8_unpack(w.qs)


def quantized_activations(x: torch.Tensor):
    """The kernels' activation rounding: per row and block of 32, d = max|x| / 127, q = round-half-even(x * 127 / max|x|)."""
    M, K = x.shape
    b = x.view(M, K // 32, 32)
    amax = b.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros(()))
    q = (b * inv[..., None]).round()
    return q.double(), (amax / 127).double(), b.double().sum(-1)


def reference_matmul(x: torch.Tensor, w) -> torch.Tensor:
    """What the kernel computes, in float64. q4: sum_j d_w d_x sum((q - 8) q_x) + (m + 8 d_w) sum(x);
    q8: sum_j d_w d_x sum(q q_x)."""
    q, d, s = quantized_activations(x)
    N, K = w.shape
    q_w = codes(w).double().view(N, K // 32, 32)
    dw = w.scale.double()
    if isinstance(w, Q4Linear):
        dots = torch.einsum("mjk,njk->mnj", q, q_w - 8)
        zero = w.minimum.double() + 8 * dw
        return (dots * dw[None] * d[:, None, :]).sum(-1) + (zero[None] * s[:, None, :]).sum(-1)
    dots = torch.einsum("mjk,njk->mnj", q, q_w)
    return (dots * dw[None] * d[:, None, :]).sum(-1)


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@pytest.mark.parametrize("N,K", [(96, 576), (36, 544), (72, 1536), (5, 32)])  # K/32 = 18, 17 (odd), 48, 1
def test_packed_matmul_computes_its_stated_arithmetic(fmt, N, K):
    w = random_q4(N, K, N + K) if fmt == "q4" else Q8Linear.quantize(torch.randn(N, K) * 0.05)
    x = torch.randn(17, K, generator=torch.Generator().manual_seed(K)) * 3
    x[3, 5] = 40.0  # an outlier channel, as real hidden states have
    x[4] = 0.0  # an all-zero row (zero block scales)
    y = w(x)
    expected = reference_matmul(x, w)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    dense = F.linear(x, w.dequantize())  # and it is the dense product up to int8 activations
    assert ((y - dense).norm() / dense.norm()).item() < 2e-2


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@pytest.mark.parametrize("K", [576, 320, 2048])  # q4 rows of 288, 160, 1024 bytes; q8 576, 320, 2048
def test_a_rows_result_never_depends_on_the_other_rows(fmt, K):
    """Row tiles (4x1 ... 1x1, a single activation row's pairs of short weight rows) and thread splits must not
    change a row's bits: batch invariance. 71 rows: the last chunk of rows is odd, so a pair is left over."""
    w = random_q4(71, K) if fmt == "q4" else Q8Linear.quantize(torch.randn(71, K))
    x = torch.randn(13, K)
    assert_rows_independent(w, x, range(13), (2, 9))


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_swiglu_epilogue_is_silu_of_gate_times_up(fmt):
    w = random_q4(190, 576, 3) if fmt == "q4" else Q8Linear.quantize(torch.randn(190, 576) * 0.05)  # odd halves
    x = torch.randn(9, 576)
    gate, up = w(x).chunk(2, dim=-1)
    torch.testing.assert_close(w(x, "swiglu"), F.silu(gate) * up, rtol=1e-5, atol=1e-6)
    assert torch.equal(w(x[4:5], "swiglu"), w(x, "swiglu")[4:5])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU")
def test_kernels_run_on_every_thread_torch_is_given():
    """The extension must be an OpenMP build: without -fopenmp at::parallel_for ran every kernel on one thread
    (batch-8 decode steps took 1.7x as long on two cores, measured)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert cpu_ext.ops().parallel_threads() == 2
        torch.set_num_threads(1)
        assert cpu_ext.ops().parallel_threads() == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_extreme_codes_and_activations_sum_exactly(fmt):
    """Full-scale codes meet full-scale activations of the same sign: q8's stored 255 x 127, twice, overflows
    the int16 pairs of AVX2's maddubs (on a CPU without VNNI every such pair came out as 32767: the default
    model's Q8_0 output head answered wrong there). The sums must be exact on every instruction set."""
    N, K = 8, 256
    signs = torch.ones(N, K)
    signs[1::2, ::2] = -1  # odd rows alternate signs within each pair of weights
    signs[2] = -1
    w = random_q4(N, K, 5) if fmt == "q4" else Q8Linear.quantize(signs * 0.5)
    if fmt == "q4":
        w = Q4Linear(torch.where(signs > 0, 15, 0).to(torch.uint8), w.scale.float(), w.minimum.float())
    else:
        assert codes(w).abs().min().item() == 127
    x = torch.cat([signs[:4], -signs[:2], torch.full((1, K), 3.0)]) * 2.5
    torch.testing.assert_close(w(x).double(), reference_matmul(x, w), rtol=1e-6, atol=1e-6)


def cpu_flags() -> set[str]:
    """This CPU's feature flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


def _has_vnni() -> bool:
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


def isa_build_env(isa: str = "avx2") -> dict[str, str]:
    """The environment of a process on a narrower build, once a process of its own has built and loaded it:
    PAGEDECK_CPU_ISA=avx2 adds -mno-avx512f -mno-avxvnni (what a CPU without VNNI compiles), =avx512
    -mno-avx512vbmi (an AVX-512 CPU without VBMI's byte permutes). A build that fails to compile fails here,
    with the compiler's words; past this point it would only make every test run on it skip ("did not
    build") and that run pass."""
    import subprocess
    import sys

    env = dict(os.environ, PAGEDECK_CPU_ISA=isa)
    probe = "from kernels import cpu_ext; print(cpu_ext.build_name(), cpu_ext.available())"
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=900)
    words = run.stdout.split()
    assert run.returncode == 0 and words[-1:] == ["True"], \
        f"the {isa} build of the CPU kernels failed:\n" + run.stdout[-2000:] + run.stderr[-6000:]
    assert words[0] != cpu_ext.build_name()  # a build of its own, not this process's
    return env


def run_on_isa_build(saved: dict, check: str, tests: list[str], deselect: str, isa: str = "avx2") -> None:
    """Under a narrower build (isa_build_env): the Python statements `check`, with `d` the tensors `saved`
    here (this build's results, to compare), then pytest on `tests` with -k `deselect`."""
    import subprocess
    import sys

    env = isa_build_env(isa)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"{isa}_bits_{os.getpid()}.pt")
    torch.save(saved, path)
    try:
        run = subprocess.run([sys.executable, "-c", f"import torch; d = torch.load({path!r}); {check}"], env=env,
                             capture_output=True, text=True, timeout=900)
    finally:
        os.unlink(path)
    assert run.returncode == 0, run.stderr[-3000:]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, "-k", deselect],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_computes_the_same_arithmetic():
    """On a VNNI machine the default build takes dpbusd; the AVX2-only build must compute the same, so both
    paths run wherever the suite runs."""
    import subprocess
    import sys

    tests = "tests/kernels/test_cpu_kernels.py"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests, "-k",
                          "stated_arithmetic or extreme_codes or never_depends"], env=isa_build_env(),
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-3000:]


def test_only_isa_h_decides_the_instruction_set():
    """Every kernel file compiles for the instruction sets kernels/cpu/isa.h decides (PD_AVX2, PD_VNNI,
    PD_AVX512, PD_AVX512_BYTES): a file that tested a compiler macro itself could pick another path than the
    rest of its build (the AVX2-only build's -mno-avx512f reaches every file only through isa.h)."""
    import re
    from pathlib import Path

    folder = Path(cpu_ext.__file__).with_name("cpu")
    macro = re.compile(r"__(?:AVX|FMA|F16C|SSE)\w*__")
    found = {p.name: sorted(set(macro.findall(p.read_text()))) for p in sorted(folder.iterdir())
             if p.suffix in (".h", ".cpp") and p.name != "isa.h"}
    assert {name: hits for name, hits in found.items() if hits} == {}
    assert macro.search((folder / "isa.h").read_text())


def test_q8_quantize_round_trips_a_q8_0_tensor():
    """The GGUF's Q8_0 embedding, dequantized, packs back to exactly its own codes and scales."""
    from engine.model.weights import GGUFFile, default_model_path

    gf = GGUFFile(default_model_path())
    blocks = gf.raw("token_embd.weight")[:4096].reshape(-1, 34)  # fp16 scale, 32 int8 codes
    scale = blocks[:, :2].contiguous().view(torch.float16).reshape(4096, -1)
    file_codes = blocks[:, 2:].contiguous().view(torch.int8).reshape(4096, -1)
    dense = gf.tensor("token_embd.weight")[:4096]
    packed = Q8Linear.quantize(dense)
    assert torch.equal(codes(packed), file_codes) and torch.equal(packed.scale, scale)
    assert torch.equal(packed.dequantize(), dense)


def test_fallbacks_without_the_extension(monkeypatch):
    w4, w8 = random_q4(64, 576), Q8Linear.quantize(torch.randn(64, 576))
    x = torch.randn(3, 576)
    monkeypatch.setenv("PAGEDECK_CPU_KERNELS", "0")
    assert cpu_ext.ops() is None
    longer = torch.cat([x, torch.randn(20, 576)])  # the dense copy, with a row's bits in any call of 12+ rows
    assert torch.equal(w8(x), F.linear(longer, w8.dense)[:3])
    dense = F.linear(x, w4.dequantize())
    if hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):  # torch's int4 kernel, bf16 activations
        assert ((w4(x) - dense).norm() / dense.norm()).item() < 1e-2
    torch.testing.assert_close(w4(x, "swiglu"), kernels.silu_mul(w4(x)))
    monkeypatch.delenv("PAGEDECK_CPU_KERNELS")
    assert cpu_ext.ops() is not None


def test_fused_rms_norm_matches_the_reference():
    x, r, w = torch.randn(5, 576), torch.randn(5, 576), torch.randn(576)
    h, s = kernels.rms_norm(x, w, 1e-5, r, fast=True)
    h_ref, s_ref = ref.rms_norm(x, w, 1e-5, r)
    assert torch.equal(s, s_ref)
    torch.testing.assert_close(h, h_ref, rtol=1e-6, atol=1e-6)
    h, s = kernels.rms_norm(x, w, 1e-5, fast=True)
    assert s is x
    torch.testing.assert_close(h, ref.rms_norm(x, w, 1e-5)[0], rtol=1e-6, atol=1e-6)


def fused_vs_reference(seqs, Hq, Hkv, D, ps, seed, dtype=torch.float32, sinks=None):
    """Run fused_attention and the reference ops on the same case (pools of `dtype`; sinks: per-head sink
    logits for both); returns both outputs and both pools."""
    case = PagedCase(seqs, Hq, Hkv, D, ps, dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    T = sum(ql for ql, _ in seqs)
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g)
    positions = torch.cat([torch.arange(kv - ql, kv) for ql, kv in seqs])
    slots = torch.cat([case.slots(b, kv - ql, kv, ps) for b, (ql, kv) in enumerate(seqs)])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    scale = D ** -0.5

    plan = kernels.plan_step(positions, inv_freq, case.block_table, case.cu_q, case.kv, ps, fuse=True)
    k_fused, v_fused = case.k_cache.clone(), case.v_cache.clone()
    out = kernels.fused_attention(qkv, k_fused, v_fused, slots, case.block_table, case.cu_q, case.kv, Hq, scale, plan,
                                  sinks)

    q = qkv[:, : Hq * D].reshape(T, Hq, D).contiguous()
    k = qkv[:, Hq * D : (Hq + Hkv) * D].reshape(T, Hkv, D).contiguous()
    v = qkv[:, (Hq + Hkv) * D :].reshape(T, Hkv, D)
    ref.apply_rotary(q, k, positions, inv_freq)
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    ref.write_kv(k, v, k_ref, v_ref, slots)
    expected = paged_attention(q, k_ref, v_ref, case.block_table, case.cu_q, case.kv, scale,
                               sinks=sinks).reshape(T, Hq * D)
    return out, expected, (k_fused, v_fused), (k_ref, v_ref), plan


@pytest.mark.parametrize("seqs,Hq,Hkv,D,ps", [
    ([(1, 1), (1, 37), (1, 300), (1, 1200)], 9, 3, 64, 16),  # decode, long contexts split into slices
    ([(1, 150)], 9, 3, 64, 256),  # the default model's batch-1 shape
    ([(5, 40), (1, 17), (3, 290), (16, 16)], 8, 2, 32, 16),  # verification rows, a whole-prompt short chunk
    ([(1, 33), (40, 600), (1, 70), (100, 100)], 6, 2, 32, 16),  # mixed: long prefill chunks, attended alike
])
def test_fused_attention_matches_rotary_write_and_paged_attention(seqs, Hq, Hkv, D, ps):
    out, expected, fused_pools, ref_pools, plan = fused_vs_reference(seqs, Hq, Hkv, D, ps, seed=len(seqs) + Hq)
    assert plan.fused and plan.attention is None and plan.short == all(ql <= 16 for ql, _ in seqs)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused_pools, ref_pools):  # same slots written, NaN everywhere else
        assert torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a.nan_to_num(), b.nan_to_num(), rtol=1e-6, atol=1e-6)


def test_fused_attention_of_a_sequence_does_not_depend_on_the_batch():
    """Sequence 0 alone and beside two others (one long, so the thread split differs): the same bits."""
    seqs, Hq, Hkv, D, ps = [(1, 700), (1, 37), (2, 1500)], 9, 3, 64, 16
    case = PagedCase(seqs, Hq, Hkv, D, ps, seed=5)
    qkv = torch.randn(4, (Hq + 2 * Hkv) * D)
    positions = torch.tensor([699, 36, 1498, 1499])
    slots = torch.cat([case.slots(b, kv - ql, kv, ps) for b, (ql, kv) in enumerate(seqs)])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))

    def run(n_seqs: int, rows: int) -> torch.Tensor:
        table, cu, kv = case.block_table[:n_seqs], case.cu_q[: n_seqs + 1], case.kv[:n_seqs]
        plan = kernels.plan_step(positions[:rows], inv_freq, table, cu, kv, ps, fuse=True)
        return kernels.fused_attention(qkv[:rows], case.k_cache.clone(), case.v_cache.clone(), slots[:rows], table,
                                       cu, kv, Hq, D ** -0.5, plan)

    assert torch.equal(run(3, 4)[:1], run(1, 1))


def test_fused_attention_refuses_bad_input():
    case = PagedCase([(1, 20)], 4, 2, 32, 16, seed=0)
    qkv = torch.randn(1, 8 * 32)
    pos = torch.tensor([19])
    inv_freq = torch.ones(16)
    plan = kernels.plan_step(pos, inv_freq, case.block_table, case.cu_q, case.kv, 16, fuse=True)
    bad_table = case.block_table.clone()
    bad_table[0, 0] = 10**6
    with pytest.raises(RuntimeError, match="page outside the pool"):
        kernels.fused_attention(qkv, case.k_cache, case.v_cache, case.slots(0, 19, 20, 16), bad_table, case.cu_q,
                                case.kv, 4, 0.1, plan)
    with pytest.raises(RuntimeError, match="slot_mapping outside"):
        kernels.fused_attention(qkv, case.k_cache, case.v_cache, torch.tensor([-1]), case.block_table, case.cu_q,
                                case.kv, 4, 0.1, plan)
    with pytest.raises(RuntimeError, match="heads"):
        kernels.fused_attention(qkv, case.k_cache, case.v_cache, case.slots(0, 19, 20, 16), case.block_table,
                                case.cu_q, case.kv, 6, 0.1, plan)


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_start():
    """torch waits forever on its build lock; a killed first-start build leaves one behind. A lock older than
    any build is removed (with a warning) and the kernels load."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from torch.utils.cpp_extension import _get_build_directory

    if not cpu_ext.available():
        pytest.skip("the CPU kernels do not build here")
    lock = Path(_get_build_directory(cpu_ext.build_name(), verbose=False)) / "lock"
    lock.touch()
    old = time.time() - cpu_ext.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    try:
        proc = subprocess.run([sys.executable, "-c", "from kernels import cpu_ext; print(cpu_ext.available())"],
                              capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
        assert proc.stdout.strip() == "True", proc.stderr
        assert "never finished" in proc.stderr and not lock.exists()
    finally:
        lock.unlink(missing_ok=True)


def test_two_checkouts_of_the_same_sources_build_under_different_names(tmp_path, monkeypatch):
    """torch's ninja file names the sources by absolute path: two checkouts sharing one build folder would
    rebuild each other's extension on every start (and wait on each other's lock). Same sources in another
    folder get their own name; the same folder keeps its name."""
    import shutil

    here = cpu_ext.build_name()
    assert cpu_ext.build_name() == here
    copy = tmp_path / "cpu"
    shutil.copytree(cpu_ext.SOURCES[0].parent, copy)
    monkeypatch.setattr(cpu_ext, "SOURCES", [copy / path.name for path in cpu_ext.SOURCES])
    assert cpu_ext.build_name() != here


def test_a_finished_build_loads_without_torchs_extension_loader():
    """A start whose build is in torch's extension cache already loads the library straight from the folder
    torch's own rule names (torch's loader imports setuptools and runs ninja: ~0.1 s of every start)."""
    import subprocess
    import sys
    from pathlib import Path

    from torch.utils.cpp_extension import _get_build_directory

    if not cpu_ext.available():
        pytest.skip("the CPU kernels do not build here")
    name = cpu_ext.build_name()
    assert str(cpu_ext.build_directory(name)) == _get_build_directory(name, verbose=False)
    probe = ("import sys; from kernels import cpu_ext; "
             "print(cpu_ext.available(), 'torch.utils.cpp_extension' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.split() == ["True", "False"], proc.stderr
