"""The MoE kernel (kernels/cpu/moe.cpp through engine.model.moe_kernel) against the torch path it replaces
(engine.model.moe.MoEBlock, one packed matmul per expert from Python): the same bits in every packed format,
batch and thread count, a row's output independent of the batch, a quantized model's greedy decoding the
same alone and batched, and clear refusals of bad input."""
from __future__ import annotations

import pytest
import torch

from engine.model import moe_kernel
from engine.model.moe import MoEBlock
from engine.model.qlinear import Q4KLinear, RowSplit
from kernels import cpu_ext
from tests.kernels.test_cpu_kernels import random_q4
from tests.kernels.test_q4k import random_q4k
from tests.kernels.test_q5 import random_q5
from tests.kernels.test_q6 import random_q6
from tests.kernels.test_q8g import random_q8

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

H, I, E, K = 512, 256, 16, 4  # K-quant widths: H and I multiples of 256


def _ungrouped(w: Q4KLinear) -> Q4KLinear:
    """Q4_K kept in rows (kernel id q4k), not regrouped 16 at a time (q4k16) as the loader does where it can."""
    w.qs, w.grouped = w.row_blocks().contiguous(), False
    return w


MAKE = {"q4k": random_q4k, "q4k rows": lambda n, k, s: _ungrouped(random_q4k(n, k, s)), "q6": random_q6,
        "q4": random_q4, "q5": lambda n, k, s: random_q5(n, k, s)[0], "q8": random_q8}
# (gate|up, down): a Q4_K_M file's pairs first, then every format on each side
PAIRS = [("q4k", "q6"), ("q4k", "q4k"), ("q4k rows", "q4k rows"), ("q4", "q8"), ("q5", "q6"), ("q8", "q4k"),
         ("q6", "q5"), ("q4k", "q4")]


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


@pytest.mark.parametrize("gate_up,down", PAIRS)
def test_kernel_gives_the_torch_paths_bits(gate_up, down):
    """Every format pair, 1 and 2 threads, batches from one row (each expert in the shared tasks) to 40 (most
    experts past kWholeCallRows, through whole qmatmul calls): the torch path's output bit for bit."""
    b = block(gate_up, down, norm_topk=gate_up != "q4")
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
    gu, dn = b.gate_up[0].blocks, b.down[0].blocks
    with pytest.raises(RuntimeError, match="do not match the first expert"):
        torch.classes.pagedeck.MoEExperts([gu[0], gu[1], gu[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0),
                                           dn[0], dn[1], dn[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0)],
                                          [0, 0, 0, 0])
    with pytest.raises(RuntimeError, match="declared format"):  # q8 blocks called q6
        torch.classes.pagedeck.MoEExperts([gu[0], gu[1], gu[1].new_empty(0), dn[0], dn[1], dn[1].new_empty(0)], [2, 0])


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
