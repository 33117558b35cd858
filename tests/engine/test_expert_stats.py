"""The expert map's counts (metrics' `experts`, engine.generator.expert_stats) against a recount of the router's
own choices over a batched run of a tiny random Qwen3-MoE: per sparse layer and per job, step by step, through
the ring's wraparound."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.generator.expert_stats import ExpertStats
from tests.engine.test_model_peer import prompt_ids
from tests.tiny_models import write_tiny_model

WINDOW = 3


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3moe", "qwen3moe", tie=False, seed=3)
    return folder, Model.load(folder, device="cpu", dtype=torch.float32)


class RouterRecord:
    """What each step's forward routed, taken beside the generator: every sparse block's route() output and
    the step's plan (which job's rows come where)."""

    def __init__(self, gen: DynamicGenerator):
        self.blocks = [layer.moe for layer in gen.model.layers if layer.moe is not None]
        self.routes: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        self.plans: list[list[tuple[int, object, int]]] = []
        for i, block in enumerate(self.blocks):
            block.route = self._route(block.route, i)
        plan = gen._plan
        gen._plan = lambda: self._plan(plan())

    def _route(self, route, i):
        def recorded(h):
            weights, experts = route(h)
            self.routes[i].append(experts.clone())
            return weights, experts
        return recorded

    def _plan(self, plan):
        self.plans.append([(e.job.serial, e.job.identifier, len(e.tokens)) for e in plan])
        return plan

    def undo(self) -> None:
        for block in self.blocks:
            del block.route  # the class's method again

    def step_counts(self, step: int, num_experts: int) -> tuple[dict, np.ndarray]:
        """serial -> (layers, experts) rows of that job in the step, and the step's rows of each expert."""
        jobs: dict[int, np.ndarray] = {}
        start = 0
        for serial, _, n in self.plans[step]:
            counts = jobs.setdefault(serial, np.zeros((len(self.blocks), num_experts), np.int64))
            for layer in range(len(self.blocks)):
                for expert in self.routes[layer][step][start:start + n].reshape(-1).tolist():
                    counts[layer, expert] += 1
            start += n
        assert all(self.routes[layer][step].shape[0] == start for layer in range(len(self.blocks)))
        return jobs, sum(jobs.values())


def test_counts_equal_a_recount_of_the_routers_choices(tiny_moe):
    folder, model = tiny_moe
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=2048, page_size=16), Tokenizer.load(folder),
                           max_chunk_size=32)
    gen.experts = stats = ExpertStats(model, window=WINDOW)
    record = RouterRecord(gen)
    greedy = SamplerSettings.greedy()
    try:
        gen.enqueue([DynamicJob(prompt_ids(20 + 17 * i, seed=i), 4 + 3 * i, gen_settings=greedy, identifier=f"chat {i}")
                     for i in range(3)])
        later = [DynamicJob(prompt_ids(9, seed=9), 6, gen_settings=greedy, identifier=("chat 0", 1))]
        seen_jobs: set[int] = set()
        step = 0
        while gen.num_remaining_jobs() or later:
            if step == 4:
                gen.enqueue(later.pop())  # joins mid-run: later steps mix its prefill with the others' decoding
            gen.iterate()
            assert len(record.plans) == step + 1 and all(len(r) == step + 1 for r in record.routes)
            kept = range(max(0, step + 1 - WINDOW), step + 1)
            per_step = [record.step_counts(s, stats.num_experts) for s in kept]
            snap = gen.metrics()["experts"]
            assert snap["layers"] == [0, 2] and (snap["num_experts"], snap["top_k"]) == (8, 2)
            assert snap["steps"] == len(kept) and snap["steps_total"] == step + 1
            np.testing.assert_array_equal(snap["counts"], sum(layers for _, layers in per_step))
            expected_jobs: dict[int, np.ndarray] = {}
            for jobs, _ in per_step:
                for serial, counts in jobs.items():
                    expected_jobs[serial] = expected_jobs.get(serial, 0) + counts
            assert snap["jobs"].keys() == expected_jobs.keys()  # a job none of the kept steps ran is gone
            for serial, counts in expected_jobs.items():
                np.testing.assert_array_equal(snap["jobs"][serial], counts, err_msg=f"job {serial}, step {step}")
            names = {serial: ident for s in kept for serial, ident, _ in record.plans[s]}
            assert snap["identifiers"] == names
            rows = sum(n for s in kept for *_, n in record.plans[s])
            assert snap["rows"] == rows and (snap["counts"].sum(axis=1) == rows * 2).all()
            read = sum(stats.router_bytes + stats.expert_bytes[layers > 0].sum() for _, layers in per_step)
            assert snap["read_bytes_per_token"] == pytest.approx(read / rows)
            seen_jobs |= expected_jobs.keys()
            step += 1
        assert step > 3 * WINDOW and len(seen_jobs) == 4  # the ring wrapped several times, every job was counted
        assert snap["jobs"].keys() < seen_jobs  # ...and jobs that left the window were dropped
    finally:
        record.undo()


def test_byte_figures_and_what_is_counted_outside_a_step(tiny_moe):
    """Per token: one row reads the router and top_k of E experts (decode_bytes), a dense model of the same size
    every expert; a route outside the generator's forward (another caller of the model) is not counted."""
    folder, model = tiny_moe
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), Tokenizer.load(folder))
    stats = gen.experts
    blocks = [layer.moe for layer in model.layers if layer.moe is not None]
    one_expert = sum(w.numel() * w.element_size() for w in (blocks[0].gate_up[0], blocks[0].down[0]))
    router = sum(b.router.numel() * b.router.element_size() for b in blocks)
    assert stats.top_k_bytes == sum(b.decode_bytes() for b in blocks) == router + len(blocks) * 2 * one_expert
    assert stats.dense_bytes == router + len(blocks) * 8 * one_expert
    blocks[0].route(torch.randn(5, model.config.hidden_size))
    snap = gen.metrics()["experts"]
    assert snap["steps"] == 0 and snap["counts"].sum() == 0 and snap["read_bytes_per_token"] is None
    gen.generate("one row at a time", max_new_tokens=3, gen_settings=SamplerSettings.greedy())
    snap = gen.metrics()["experts"]
    assert snap["steps"] == 3 and snap["counts"].sum() == snap["rows"] * 2 * len(blocks)
    # a decode step of one row reads at most its k experts a layer: never more than the top-k figure
    assert snap["read_bytes_per_token"] < stats.top_k_bytes < stats.dense_bytes


def test_a_dense_model_has_no_expert_map(tmp_path):
    folder = write_tiny_model(tmp_path / "dense", "qwen3", seed=1)
    model = Model.load(folder, device="cpu", dtype=torch.float32)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=512, page_size=16), Tokenizer.load(folder))
    gen.generate("hello", max_new_tokens=2)
    assert gen.metrics()["experts"] is None
    with pytest.raises(ValueError, match="window"):
        ExpertStats(model, window=0)
