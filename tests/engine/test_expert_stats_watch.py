"""The expert map's counting runs only while someone reads it (engine.generator.expert_stats' lease): a
generator's first `window` steps are counted, later ones only within WATCH_S seconds or `window` steps of a
snapshot; a snapshot after uncounted steps starts the window afresh, and counting goes on from there."""
from __future__ import annotations

import pytest
import torch

from engine import DynamicGenerator, Model, PagedCache, SamplerSettings, Tokenizer
from engine.generator import expert_stats
from engine.generator.expert_stats import ExpertStats
from tests.tiny_models import write_tiny_model

WINDOW = 3


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3moe", "qwen3moe", tie=False, seed=3)
    return folder, Model.load(folder, device="cpu", dtype=torch.float32)


def test_steps_are_counted_only_while_watched(tiny_moe, monkeypatch):
    folder, model = tiny_moe
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), Tokenizer.load(folder))
    gen.experts = stats = ExpertStats(model, window=WINDOW)
    monkeypatch.setattr(expert_stats, "WATCH_S", 0.0)  # the steps' lease alone
    counted = []
    count = stats._count
    monkeypatch.setattr(stats, "_count", lambda plan, choices: (counted.append(len(plan)), count(plan, choices)))
    greedy = SamplerSettings.greedy()
    gen.generate("nobody watches", max_new_tokens=2 * WINDOW + 2, gen_settings=greedy)
    assert len(counted) == WINDOW and stats.steps_total == WINDOW  # the first steps only
    assert not stats.watched
    snap = gen.metrics()["experts"]  # someone looks: the window restarts empty
    assert snap["steps_total"] == snap["steps"] == 0 and snap["counts"].sum() == 0 and stats.watched
    gen.generate("now watched", max_new_tokens=2, gen_settings=greedy)
    snap = gen.metrics()["experts"]
    assert len(counted) == WINDOW + 2 and snap["steps_total"] == 2 and snap["counts"].sum() == snap["rows"] * 2 * 2
    monkeypatch.setattr(expert_stats, "WATCH_S", 60.0)  # a recent snapshot keeps counting past `window` steps
    gen.generate("read a moment ago", max_new_tokens=2 * WINDOW, gen_settings=greedy)
    assert len(counted) == 3 * WINDOW + 2 and gen.metrics()["experts"]["steps_total"] == 2 * WINDOW + 2
