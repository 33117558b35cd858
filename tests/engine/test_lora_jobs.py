"""Per-job LoRA adapters: jobs with different adapter sets in the same steps.

Oracles: each job run alone, the base model with the adapters merged into its weights (by PEFT's
merge_and_unload, or by hand from the files for weighted combinations), and a one-pass forward per
sequence for the logits of a mixed step.
"""
from __future__ import annotations

import shutil

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.model.batch import Batch
from engine.model.lora import LoRA, LoRASet, LoRAStack
from engine.model.lora.batch import LoRABatch
from tests.engine.pagetable_checks import check_released, check_table, live_sequences
from tests.engine.test_generator import run_all
from tests.engine.test_lora import GREEDY, merge_by_hand, prompt_ids, write_peft_adapter
from tools.logits import forward_tokens

COMBO = [("all", 0.7), ("qv", -0.5)]


@pytest.fixture(scope="module")
def folders(tiny_llama_folder, tmp_path_factory):
    """Adapters written by PEFT, and the models with them merged (PEFT for single ones, by hand for a mix)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora_jobs")
    out = {"base": tiny_llama_folder,
           "all": write_peft_adapter(tiny_llama_folder, root / "all", r=4, alpha=8),
           "qv": write_peft_adapter(tiny_llama_folder, root / "qv", r=8, alpha=16, targets=["q_proj", "v_proj"], seed=1)}
    for name in ("all", "qv"):
        hf = AutoModelForCausalLM.from_pretrained(tiny_llama_folder, dtype=torch.float32)
        PeftModel.from_pretrained(hf, out[name]).merge_and_unload().save_pretrained(root / f"merged_{name}")
        shutil.copy(tiny_llama_folder / "tokenizer.json", root / f"merged_{name}" / "tokenizer.json")
        out[f"merged_{name}"] = root / f"merged_{name}"
    out["merged_combo"] = merge_by_hand(tiny_llama_folder, root / "merged_combo", [(out[n], s) for n, s in COMBO])
    return out


@pytest.fixture
def model(folders):
    return Model.load(folders["base"])


def make_gen(model, folders, **kw) -> DynamicGenerator:
    return DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=16), Tokenizer.load(folders["base"]),
                            **kw)


def loaded_gen(model, folders, **kw) -> DynamicGenerator:
    gen = make_gen(model, folders, **kw)
    for name in ("all", "qv"):
        gen.load_lora(folders[name])
    return gen


def run(gen, jobs, watch=None):
    """Step until every job ends, checking the page table each step; tokens and last result per job."""

    def each_step(g):
        check_table(g.pagetable, live_sequences(g))
        if watch is not None:
            watch(g)

    out = run_all(gen, jobs, each_step)
    check_released(gen.pagetable)
    return out


def job(ids, loras, n=16, **kw):
    return DynamicJob(ids, n, gen_settings=GREEDY, loras=loras, **kw)


# ---------------------------------------------------------------- the forward

def test_mixed_step_logits_equal_each_sequence_alone(model, folders):
    """One varlen forward with four adapter sets (and base rows) == each sequence's own one-pass forward."""
    all_, qv = LoRA.load(folders["all"], model), LoRA.load(folders["qv"], model)
    sets = [{}, {all_: 1.0}, {qv: 1.0}, {all_: 0.7, qv: -0.5}, {all_: 1.0}]
    prompts = [prompt_ids(n, seed=20 + i) for i, n in enumerate([5, 33, 1, 17, 8])]
    page = 16
    cache = PagedCache(model, max_tokens=64 * len(prompts), page_size=page)
    seqs = [(p[0].tolist(), 0, list(range(4 * i, 4 * i + 4))) for i, p in enumerate(prompts)]
    batch = Batch.build(seqs, page, [p.shape[1] for p in prompts], model.device)
    stack = LoRAStack(model, [all_, qv])
    lora = LoRABatch(stack, [(p.shape[1], s) for p, s in zip(prompts, sets)])
    assert lora.seg_rows == (5, 33, 1, 17, 8)
    mixed = model.forward(batch, cache, lora=lora)[:, : model.vocab_size]
    for i, (p, s) in enumerate(zip(prompts, sets)):
        alone = forward_tokens(model, p, lora=LoRASet(model, list(s), list(s.values())) if s else None)
        rows = mixed[batch.logit_offsets[i] : batch.logit_offsets[i + 1]]
        # Not bitwise: MKL's sgemm rounds a row differently at different row counts (M=1 vs M=64 differ
        # in the last bit even without LoRA), so the tolerance is a few float32 ulps of the logits.
        torch.testing.assert_close(rows, alone, rtol=0, atol=2e-5 * alone.abs().max().item())
    base = forward_tokens(model, prompts[1])
    assert (mixed[batch.logit_offsets[1] : batch.logit_offsets[2]] - base).abs().max() > 1.0  # adapters matter


def test_rows_without_adapters_are_untouched(model, folders):
    all_ = LoRA.load(folders["all"], model)
    stack = LoRAStack(model, [all_])
    x, y = torch.randn(7, model.config.hidden_size), torch.randn(7, model.q_size + 2 * model.kv_size)
    before = y.clone()
    LoRABatch(stack, [(3, {}), (2, {all_: 1.0}), (2, {})]).add(0, "qkv", x, y)
    assert torch.equal(y[:3], before[:3]) and torch.equal(y[5:], before[5:]) and not torch.equal(y[3:5], before[3:5])
    with pytest.raises(ValueError, match="planned for 7 rows"):
        LoRABatch(stack, [(7, {all_: 1.0}), (0, {})]).add(0, "qkv", x[:6], y[:6])


# ---------------------------------------------------------------- the generator

def test_mixed_batch_equals_each_job_alone_and_the_merged_models(model, folders):
    ids = prompt_ids(37, seed=3)
    requests = {"base": [], "all": ["all"], "qv": [("qv", 1.0)], "combo": COMBO}
    gen = loaded_gen(model, folders)
    sets_at_once = []

    def watch(g):
        live = {i for i, owner in zip(g.metrics()["page_adapters"], g.metrics()["page_states"]) if owner >= 0}
        sets_at_once.append(len(live))

    jobs = [job(ids, req, 20) for req in requests.values()]
    mixed, finals = run(gen, jobs, watch)
    assert max(sets_at_once) == 4 and gen.metrics()["batch_size"] >= 1  # the four sets ran in the same steps
    for (name, req), got, fin in zip(requests.items(), mixed, finals):
        (alone,), _ = run(loaded_gen(model, folders), [job(ids, req, 20)])
        (merged,), _ = run(make_gen(Model.load(folders[f"merged_{name}"] if name != "base" else folders["base"]),
                                    folders), [job(ids, None, 20)])
        assert got == alone == merged, name
        assert fin["cached_tokens"] == 0  # same prompt, other adapters: nothing to share
    assert len({tuple(t) for t in mixed}) == 4  # every set really changes the output


def test_results_report_each_jobs_adapters(model, folders):
    gen = loaded_gen(model, folders)
    gen.set_loras(folders["qv"], 0.5)
    jobs = [job(prompt_ids(20, 1), [("all", 0.7), "qv"], 4), job(prompt_ids(20, 2), None, 4),
            job(prompt_ids(20, 3), [], 4)]
    started = {}
    gen.enqueue(jobs)
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "started":
                started[id(r["job"])] = r["loras"]
            if r.get("eos"):
                assert r["loras"] == started[id(r["job"])]
    assert [started[id(j)] for j in jobs] == [[("all", 0.7), ("qv", 1.0)], [("qv", 0.5)], []]


def test_pages_are_shared_exactly_between_equal_adapter_sets(model, folders):
    gen = loaded_gen(model, folders)
    ids = prompt_ids(40, seed=6)  # two full pages of 16 and a partial one

    def cached(loras):
        return run(gen, [job(ids, loras, 4)])[1][0]["cached_tokens"]

    assert cached(["all"]) == 0
    assert cached([("all", 1.0)]) >= 32  # the same adapter by name: its pages are reused
    assert cached([gen.adapters.loaded["all"]]) >= 32  # ... or by object
    assert cached([("all", 0.5)]) == 0  # another scale: other K/V
    assert cached(["qv"]) == 0 and cached([]) == 0
    assert cached([("all", 0.7), ("qv", -0.5)]) == 0
    assert cached([("qv", -0.5), ("all", 0.7)]) >= 32  # a set is a set, whatever the order
    gen.set_loras(folders["all"])
    assert gen.adapters.loaded["all"] is gen.loras[0]  # the default set reuses the loaded adapter
    assert cached(None) >= 32  # the default set is the same set as naming it
    # Running at once: equal sets share their prefix pages, different ones never do.
    shared_seen = []

    def watch(g):
        m = g.metrics()
        shared_seen.append({m["page_adapters"][i] for i, s in enumerate(m["page_shared"]) if s})

    run(gen, [job(ids, ["qv"], 8), job(ids, ["qv"], 8), job(ids, [("qv", 2.0)], 8), job(ids, [], 8)], watch)
    labels = gen.metrics()["adapter_sets"]
    qv_id = next(i for i, label in labels.items() if label == [("qv", 1.0)])
    assert set().union(*shared_seen) == {qv_id}


def test_metrics_label_pages_by_adapter_set(model, folders):
    gen = loaded_gen(model, folders)
    seen = []
    run(gen, [job(prompt_ids(40, 7), ["all"], 8), job(prompt_ids(40, 8), [], 8)],
        lambda g: seen.append(g.metrics()))
    m = seen[0]
    owned = {m["adapter_sets"][a][0][0] if m["adapter_sets"][a] else "base"
             for a, s in zip(m["page_adapters"], m["page_states"]) if s >= 0}
    assert owned == {"all", "base"}
    assert all(a == -1 for a, s in zip(m["page_adapters"], m["page_states"]) if s == -2)
    after = gen.metrics()  # the prompt cache keeps its labels
    assert {tuple(after["adapter_sets"][a]) for a, s in zip(after["page_adapters"], after["page_states"])
            if s == -1} == {(("all", 1.0),), ()}
    assert sorted(after["loras_loaded"]) == ["all", "qv"] and after["loras"] == []


def test_default_set_for_jobs_naming_none_runs_beside_explicit_sets(model, folders):
    ids = prompt_ids(30, seed=9)
    want_all, _ = run(make_gen(Model.load(folders["merged_all"]), folders), [job(ids, None)])
    want_base, _ = run(make_gen(model, folders), [job(ids, None)])
    gen = loaded_gen(model, folders)
    gen.set_loras(folders["all"])
    got, finals = run(gen, [job(ids, None), job(ids, []), job(ids, ["all"])])
    assert got == [want_all[0], want_base[0], want_all[0]]
    assert [f["loras"] for f in finals] == [[("all", 1.0)], [], [("all", 1.0)]]


# ---------------------------------------------------------------- loading and unloading

def test_load_lora_registers_once_by_name(model, folders, tmp_path):
    gen = make_gen(model, folders)
    a = gen.load_lora(folders["all"])
    assert gen.load_lora(folders["all"]) is a and gen.load_lora(a) is a and a.name == "all"
    other = write_peft_adapter(folders["base"], tmp_path / "all", seed=7)  # another adapter, same folder name
    with pytest.raises(ValueError, match="another LoRA adapter named 'all'"):
        gen.load_lora(other)
    b = gen.load_lora(other, name="all-v2")
    assert sorted(gen.adapters.loaded) == ["all", "all-v2"] and b.content_hash != a.content_hash
    with pytest.raises(ValueError, match="'pirate' is not loaded"):
        gen.enqueue(job(prompt_ids(8), ["pirate"]))
    stranger = LoRA.load(other, model, name="all")  # not the generator's "all"
    with pytest.raises(ValueError, match="other weights"):
        gen.enqueue(job(prompt_ids(8), [stranger]))
    with pytest.raises(TypeError, match="list of"):
        DynamicJob(prompt_ids(8), 4, loras="all")
    with pytest.raises(ValueError, match="named twice"):
        DynamicJob(prompt_ids(8), 4, loras=["all", ("all", 0.5)])
    with pytest.raises(ValueError, match="finite"):
        DynamicJob(prompt_ids(8), 4, loras=[("all", float("inf"))])
    assert gen.num_remaining_jobs() == 0


def test_unload_lets_running_and_queued_jobs_finish_and_refuses_new_ones(model, folders):
    gen = loaded_gen(model, folders, max_batch_size=1)
    ids = prompt_ids(20, seed=11)
    (want,), _ = run(loaded_gen(model, folders), [job(ids, ["qv"], 6)])
    running, queued = job(ids, ["qv"], 6), job(ids, ["qv"], 6)
    gen.enqueue([running, queued])
    tokens = {id(running): [], id(queued): []}
    for r in gen.iterate():
        tokens[id(r["job"])] += r.get("token_ids", [])
    assert running in gen.active and queued in gen.pending
    assert gen.unload_lora("qv") is False  # in use: it goes when they are done
    with pytest.raises(ValueError, match="being unloaded"):
        gen.enqueue(job(ids, ["qv"]))
    with pytest.raises(ValueError, match="being unloaded"):
        gen.load_lora(folders["qv"])
    while gen.num_remaining_jobs():
        assert "qv" in gen.adapters.loaded
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens[id(r["job"])] += r["token_ids"]
    assert tokens[id(running)] == tokens[id(queued)] == want
    assert "qv" not in gen.adapters.loaded and gen.metrics()["loras_loaded"] == ["all"]
    assert gen.load_lora(folders["qv"]).name == "qv"  # loadable again
    assert gen.unload_lora(gen.adapters.loaded["qv"]) is True  # idle: at once
    gen.set_loras("all", 0.5)  # a loaded adapter's name works where a path does
    assert gen.loras == [gen.adapters.loaded["all"]]


def test_unload_refusals(model, folders):
    gen = loaded_gen(model, folders)
    with pytest.raises(ValueError, match="not loaded"):
        gen.unload_lora("pirate")
    gen.set_loras(folders["all"])
    with pytest.raises(ValueError, match="default set"):
        gen.unload_lora("all")
    cancelled = job(prompt_ids(20), ["qv"])
    gen.enqueue(cancelled)
    assert gen.unload_lora("qv") is False
    gen.cancel(cancelled)  # its only job leaves the queue: the adapter goes with it
    assert "qv" not in gen.adapters.loaded


# ---------------------------------------------------------------- with the other features

def test_speculative_decoding_keeps_each_jobs_adapter_output(model, folders):
    """The draft model has no adapters: its drafts are just worse guesses, the main model verifies them."""
    prompts = [prompt_ids(24, seed=30 + i) for i in range(4)]
    requests = [["all"], ["qv"], [], COMBO]
    want, _ = run(loaded_gen(model, folders), [job(p, r, 24) for p, r in zip(prompts, requests)])
    draft = Model.load(folders["base"])
    spec = loaded_gen(model, folders, draft_model=draft, draft_cache=PagedCache(draft, 1024, 16), num_draft_tokens=3)
    got, finals = run(spec, [job(p, r, 24) for p, r in zip(prompts, requests)])
    assert got == want
    assert finals[2]["accepted_draft_tokens"] > 0 and sum(f["rejected_draft_tokens"] for f in finals) > 0
    ngram = loaded_gen(model, folders, use_ngram_draft=True)
    assert run(ngram, [job(p, r, 24) for p, r in zip(prompts, requests)])[0] == want


def test_cfg_and_filters_with_adapters(model, folders):
    from engine import ChoiceFilter

    pos, neg, plain = prompt_ids(20, 40), prompt_ids(9, 41), prompt_ids(25, 42)
    cfg = SamplerSettings.greedy(cfg_scale=2.0)
    ref = make_gen(model, folders)
    ref.set_loras(folders["all"])
    (want_cfg,), _ = run(ref, [DynamicJob([pos, neg], 12, gen_settings=cfg)])
    (want_filtered,), _ = run(ref, [DynamicJob(plain, 12, gen_settings=GREEDY, filters=[ChoiceFilter(["yes", "no"])])])
    gen = loaded_gen(model, folders)
    got, _ = run(gen, [DynamicJob([pos, neg], 12, gen_settings=cfg, loras=["all"]), job(plain, ["qv"], 12),
                       DynamicJob(plain, 12, gen_settings=GREEDY, loras=["all"], filters=[ChoiceFilter(["yes", "no"])])])
    assert got[0] == want_cfg and got[2] == want_filtered
    assert ref.tokenizer.decode(got[2]).strip() in ("yes", "no")
