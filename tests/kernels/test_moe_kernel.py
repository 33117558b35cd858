"""The MoE kernel (kernels/cpu/moe.cpp through engine.model.moe_kernel) against the torch path it replaces
(engine.model.moe.MoEBlock, one packed matmul per expert from Python): the same bits in every packed format,
batch and thread count, a row's output independent of the batch, a quantized model's greedy decoding the
same alone and batched, and clear refusals of bad input; gpt-oss's experts (biases, the clamped SwiGLU, MXFP4)
likewise."""
from __future__ import annotations

from functools import partial

import pytest
import torch

from engine.model import moe_kernel
from engine.model.moe import MoEBlock
from engine.model.qlinear import Q4KLinear, RowSplit
from engine.model.qlinear.lut4 import LUT4_CLASSES
from kernels import cpu_ext
from tests.kernels.test_cpu_kernels import random_q4
from tests.kernels.test_lut4 import from_writer
from tests.kernels.test_q4k import random_q4k
from tests.kernels.test_q5 import random_q5
from tests.kernels.test_q5k import random_q5k
from tests.kernels.test_q6 import random_q6
from tests.kernels.test_q8g import random_q8

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

H, I, E, K = 512, 256, 16, 4  # K-quant widths: H and I multiples of 256
INF = float("inf")


def _ungrouped(w: Q4KLinear) -> Q4KLinear:
    """Q4_K kept in rows (kernel id q4k), not regrouped 16 at a time (q4k16) as the loader does where it can."""
    w.qs, w.grouped = w.row_blocks().contiguous(), False
    return w


def _lut4(fmt: str):
    return lambda n, k, s: LUT4_CLASSES[fmt](from_writer(fmt, n, k, s))


MAKE = {"q4k": random_q4k, "q4k rows": lambda n, k, s: _ungrouped(random_q4k(n, k, s)), "q6": random_q6,
        "q4": random_q4, "q5": lambda n, k, s: random_q5(n, k, s)[0], "q8": random_q8, "q5k": random_q5k,
        **{fmt: _lut4(fmt) for fmt in LUT4_CLASSES}}
# (gate|up, down): a Q4_K_M file's pairs first, then every format on each side
PAIRS = [("q4k", "q6"), ("q4k", "q4k"), ("q4k rows", "q4k rows"), ("q4", "q8"), ("q5", "q6"), ("q8", "q4k"),
         ("q6", "q5"), ("q4k", "q4"), ("mxfp4", "mxfp4"), ("iq4xs", "iq4nl"), ("iq4nl", "q4k"), ("q5k", "iq4xs"),
         ("q4k", "q5k")]


def block(gate_up: str, down: str, norm_topk: bool = True, seed: int = 0) -> MoEBlock:
    g = torch.Generator().manual_seed(seed)
    return MoEBlock(router=torch.randn(E, H, generator=g) * 0.1,
                    gate_up=[MAKE[gate_up](2 * I, H, seed + e) for e in range(E)],
                    down=[MAKE[down](H, I, seed + 100 + e) for e in range(E)], top_k=K, norm_topk=norm_topk)


def both_paths(b: MoEBlock, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert moe_kernel.runs(b, h, None)
    kernel = b(h)
    with moe_kernel.torch_path():
        assert not moe_kernel.runs(b, h, None)
        return kernel, b(h)


def same_bits_in_every_batch(b: MoEBlock) -> None:
    """The kernel's output is the torch path's bit for bit at 1 and 2 threads and batches of 1 row (each expert
    in the shared tasks), 3, 8 and 40 rows (most experts past kWholeCallRows, through whole qmatmul calls); the
    caller's thread count is restored."""
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for T in (1, 3, 8, 40):
                h = torch.randn(T, H, generator=torch.Generator().manual_seed(T))
                kernel, oracle = both_paths(b, h)
                assert torch.equal(kernel, oracle), (n, T, (kernel - oracle).abs().max().item())
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("gate_up,down", PAIRS)
def test_kernel_gives_the_torch_paths_bits(gate_up, down):
    """Every format pair, 1 and 2 threads, batches from one row (each expert in the shared tasks) to 40 (most
    experts past kWholeCallRows, through whole qmatmul calls): the torch path's output bit for bit."""
    b = block(gate_up, down, norm_topk=gate_up != "q4")
    same_bits_in_every_batch(b)


LIMIT, ALPHA = 7.0, 1.702  # gpt-oss's clamped SwiGLU


def gpt_oss_block(gate_up: str, down: str, seed: int = 0) -> MoEBlock:
    """gpt-oss's options on block(): biased router and experts, a softmax over the top-k logits, the clamped
    SwiGLU; gate|up biases wide enough that many of its outputs pass the limit on either side."""
    g = torch.Generator().manual_seed(seed + 1)
    b = block(gate_up, down, seed=seed)
    b.router_bias = torch.randn(E, generator=g)
    b.gate_up_bias = [torch.randn(2 * I, generator=g) * 8 for _ in range(E)]
    b.down_bias = [torch.randn(H, generator=g) for _ in range(E)]
    b.routing, b.swiglu_limit, b.swiglu_alpha = "topk_softmax", LIMIT, ALPHA
    return b


@pytest.mark.parametrize("gate_up,down", [("mxfp4", "mxfp4"), ("q8", "q8"), ("mxfp4", "q4k"), ("iq4nl", "mxfp4")])
def test_gpt_oss_experts_give_the_torch_paths_bits(gate_up, down):
    """Biased experts with the clamped SwiGLU (act 2), MXFP4 as gpt-oss's files hold them and other formats:
    the torch path's output bit for bit, in the shared tasks and in whole calls, 1 and 2 threads."""
    b = gpt_oss_block(gate_up, down)
    pre = b.gate_up[0](torch.randn(64, H, generator=torch.Generator().manual_seed(3))) + b.gate_up_bias[0]
    assert (pre[:, :I] > LIMIT).any() and (pre[:, I:] > LIMIT).any() and (pre[:, I:] < -LIMIT).any()
    same_bits_in_every_batch(b)


def test_clamped_swiglu_is_gpt_osss_formula():
    """The C++ clamped SwiGLU (the kernel's epilogue, which the torch path calls too) against gpt-oss's formula
    in torch ops: within a few ulps, the clamps exact (past the limit, the limit's bits), NaN kept, and an
    element's bits the same whatever row or column range it is computed in."""
    ops = cpu_ext.ops()
    gu = torch.randn(37, 2 * 203, generator=torch.Generator().manual_seed(0)) * 6  # 203: a tail past 8 lanes
    gu[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    got = ops.clamped_swiglu(gu, LIMIT, ALPHA)
    gate, up = gu.chunk(2, dim=-1)
    gate, up = gate.clamp(max=LIMIT), up.clamp(min=-LIMIT, max=LIMIT)
    expected = (up + 1) * (gate * torch.sigmoid(gate * ALPHA))
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-6, equal_nan=True)
    assert got[0, 0].isnan()
    at_limit = gu.clone()
    at_limit[:, :203] = gu[:, :203].clamp(max=LIMIT)
    at_limit[:, 203:] = gu[:, 203:].clamp(min=-LIMIT, max=LIMIT)
    same_bits = partial(torch.testing.assert_close, rtol=0, atol=0, equal_nan=True)
    same_bits(ops.clamped_swiglu(at_limit, LIMIT, ALPHA), got)
    for r in (0, 5, 36):
        same_bits(ops.clamped_swiglu(gu[r:r + 1], LIMIT, ALPHA)[0], got[r])
    narrow = torch.cat([gu[:, 3:203], gu[:, 206:]], dim=1)  # columns 3.. of gate and up
    same_bits(ops.clamped_swiglu(narrow, LIMIT, ALPHA), got[:, 3:])


def test_a_rows_output_does_not_depend_on_the_batch():
    """Given a row's experts and weights, its output is the same bits alone, in a batch of 8 (shared tasks) or
    of 64 (whole calls), or shuffled. (The router's own matmul may round a row's weights differently in
    another batch: tests/engine/test_moe.py bounds that.)"""
    b = block("q4k", "q6")
    h = torch.randn(64, H, generator=torch.Generator().manual_seed(1))
    w, e = b.route(h)
    together = moe_kernel.experts(b, h, w, e)
    for i in (0, 5, 63):
        assert torch.equal(moe_kernel.experts(b, h[i:i + 1], w[i:i + 1], e[i:i + 1])[0], together[i])
        assert torch.equal(moe_kernel.experts(b, h[i:i + 8], w[i:i + 8], e[i:i + 8])[0], together[i])
    shuffled = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(moe_kernel.experts(b, h[shuffled], w[shuffled], e[shuffled]), together[shuffled])


def test_the_torch_path_stays_where_the_kernel_does_not_apply():
    """Dense experts, fp64 rows, and steps whose prompt rows take the exact dense weights take the torch path."""
    b = block("q4k", "q6")
    h = torch.randn(4, H)
    dense = MoEBlock(router=b.router, gate_up=[w.dequantize() for w in b.gate_up], down=[w.dequantize() for w in b.down],
                     top_k=K, norm_topk=True)
    assert not moe_kernel.runs(dense, h, None)
    assert not moe_kernel.runs(b, h.double(), None)
    assert not moe_kernel.runs(b, h, RowSplit(torch.tensor([0, 1]), 4))
    assert moe_kernel.runs(b, h, RowSplit(None, 4))


def test_bad_input_is_refused_by_name():
    b = block("q8", "q8")
    table = moe_kernel.table(b)
    ops = cpu_ext.ops()
    h, w = torch.randn(2, H), torch.full((2, K), 0.25)
    with pytest.raises(RuntimeError, match="out of range"):
        ops.moe_experts(h, torch.tensor([[0, 1, 2, E]] * 2), w, table, 1)
    with pytest.raises(RuntimeError, match="x must be"):
        ops.moe_experts(torch.randn(2, H + 32), torch.zeros(2, K, dtype=torch.long), w, table, 1)
    with pytest.raises(RuntimeError, match="unknown activation"):
        ops.moe_experts(h, torch.zeros(2, K, dtype=torch.long), w, table, 7)
    biased = moe_kernel.table(gpt_oss_block("q8", "q8"))
    with pytest.raises(RuntimeError, match="biased experts take the clamped SwiGLU"):
        ops.moe_experts(h, torch.zeros(2, K, dtype=torch.long), w, biased, 1)
    gu, dn = b.gate_up[0].blocks, b.down[0].blocks
    with pytest.raises(RuntimeError, match="do not match the first expert"):
        torch.classes.pagedeck.MoEExperts([gu[0], gu[1], gu[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0),
                                           dn[0], dn[1], dn[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0)],
                                          [0, 0, 0, 0], [], INF, 1.0)
    with pytest.raises(RuntimeError, match="no biases or two an expert"):
        torch.classes.pagedeck.MoEExperts([gu[0], gu[1], gu[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0)], [0, 0],
                                          [torch.zeros(2 * I)], INF, 1.0)
    with pytest.raises(RuntimeError, match="down bias must be"):
        torch.classes.pagedeck.MoEExperts([gu[0], gu[1], gu[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0)], [0, 0],
                                          [torch.zeros(2 * I), torch.zeros(I)], INF, 1.0)
    with pytest.raises(RuntimeError, match="declared format"):  # q8 blocks called q6
        torch.classes.pagedeck.MoEExperts([gu[0], gu[1], gu[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0)], [2, 0],
                                          [], INF, 1.0)


def test_a_quantized_models_greedy_tokens_are_the_same_alone_and_batched(tmp_path):
    """A tiny Qwen3-MoE with q8 experts runs its sparse layers through the kernel; jobs decoded together give
    the tokens each gives alone, and the torch path's."""
    from engine import Model, Tokenizer
    from tests.engine.test_model_peer import prompt_ids
    from tests.engine.test_moe import run_greedy
    from tests.tiny_models import write_tiny_model

    folder = write_tiny_model(tmp_path / "q", "qwen3moe", tie=False, seed=3)
    model = Model.load(folder, device="cpu", dtype=torch.float32, weights="q8")
    sparse = [layer.moe for layer in model.layers if layer.moe is not None]
    assert sparse and all(moe_kernel.runs(m, torch.zeros(1, model.config.hidden_size), None) for m in sparse)
    tok = Tokenizer.load(folder)
    prompts = [prompt_ids(5 + 9 * i, seed=20 + i) for i in range(4)]
    alone = [run_greedy(model, tok, [p], 12)[0] for p in prompts]
    assert run_greedy(model, tok, prompts, 12) == alone
    with moe_kernel.torch_path():
        assert run_greedy(model, tok, prompts, 12) == alone


def test_router_logits_do_not_depend_on_the_batch():
    """A row's router logits are the same bits alone, among others and on one thread (torch's sgemm rounds by the
    row count: a near-tie between two experts then routed a row differently batched than alone), and are the
    float product up to rounding."""
    import kernels

    g = torch.Generator().manual_seed(3)
    router, bias = torch.randn(128, 2048, generator=g), torch.randn(128, generator=g)
    h = torch.randn(37, 2048, generator=g)
    together = kernels.router_logits(h, router, bias)
    for i in (0, 5, 36):
        assert torch.equal(kernels.router_logits(h[i:i + 1], router, bias), together[i:i + 1])
    assert torch.equal(kernels.router_logits(h[3:11], router, bias), together[3:11])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernels.router_logits(h, router, bias), together)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(together, torch.nn.functional.linear(h.double(), router.double(), bias.double()).float(),
                               rtol=1e-5, atol=1e-4)
