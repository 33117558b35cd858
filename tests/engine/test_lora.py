"""LoRA adapters on tiny random models, with peft as the format and arithmetic peer.

The oracle for "adapter applied on the fly" is the base model with the adapter merged into its weights:
merged by peft's merge_and_unload, or by hand from the raw adapter files, then loaded as a plain model.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.contract import demo_adapters_folder, find_adapters
from engine.model.lora import LoRA, LoRASet, MissingAdapterFile
from tests.tiny_models import write_tiny_model
from tools.logits import forward_tokens

GREEDY = SamplerSettings.greedy()
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ---------------------------------------------------------------- helpers

def write_peft_adapter(base: Path, out: Path, *, r: int = 4, alpha: float = 8, targets=ALL, use_rslora=False,
                       seed: int = 0, std: float = 0.2, bin: bool = False, **config) -> Path:
    """A random adapter written by peft itself (its exact on-disk format), B non-zero so it has an effect."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(hf, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                                               use_rslora=use_rslora, lora_dropout=0.0, **config))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    peft_model.save_pretrained(out, safe_serialization=not bin)
    return out


def merge_by_hand(base: Path, out: Path, adapters: list[tuple[Path, float]]) -> Path:
    """Base weights + sum of scale * (alpha/r or alpha/sqrt r) * B @ A, read straight from the adapter files."""
    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    state = load_file(base / "model.safetensors")
    for folder, scale in adapters:
        cfg = json.loads((folder / "adapter_config.json").read_text())
        s = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg["use_rslora"] else cfg["r"])
        tensors = load_file(folder / "adapter_model.safetensors")
        for key, a in tensors.items():
            if ".lora_A." in key:
                b = tensors[key.replace(".lora_A.", ".lora_B.")]
                target = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
                state[target] = state[target] + scale * s * (b.double() @ a.double()).float()
    save_file(state, out / "model.safetensors")
    return out


def run(gen: DynamicGenerator, ids: torch.Tensor, n: int = 16) -> tuple[list[int], dict]:
    job = DynamicJob(ids, n, gen_settings=GREEDY)
    gen.enqueue(job)
    tokens, final = [], None
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens += r["token_ids"]
                if r["eos"]:
                    final = r
    return tokens, final


def prompt_ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(10, 40000, (1, n), generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=2e-4 * max(1.0, b.abs().max().item()))


@pytest.fixture(scope="module")
def tiny_folder(tiny_llama_folder) -> Path:
    return tiny_llama_folder  # the suite's shared tiny Llama (read only here)


@pytest.fixture(scope="module")
def adapters(tiny_folder, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "all": write_peft_adapter(tiny_folder, root / "all", r=4, alpha=8),
        "qv": write_peft_adapter(tiny_folder, root / "qv", r=8, alpha=16, targets=["q_proj", "v_proj"], seed=1),
        "rs": write_peft_adapter(tiny_folder, root / "rs", r=4, alpha=8, use_rslora=True, seed=2),
    }


@pytest.fixture
def model(tiny_folder):
    return Model.load(tiny_folder)


def make_gen(model, tiny_folder) -> DynamicGenerator:
    return DynamicGenerator(model, PagedCache(model, max_tokens=512, page_size=16), Tokenizer.load(tiny_folder))


# ---------------------------------------------------------------- correctness

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # qwen2: q/k/v bias; qwen3: q/k norm after LoRA
def test_adapter_equals_peft_merged_weights(arch, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = write_tiny_model(tmp_path / "base", arch=arch)
    adapter = write_peft_adapter(base, tmp_path / "adapter", r=4, alpha=8)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    ids = prompt_ids(40)
    with torch.no_grad():
        peft_logits = peft_model(ids).logits[0]
        peft_model.merge_and_unload().save_pretrained(tmp_path / "merged")
    shutil.copy(base / "tokenizer.json", tmp_path / "merged" / "tokenizer.json")

    ours, merged = Model.load(base), Model.load(tmp_path / "merged")
    plain = forward_tokens(ours, ids)
    with_lora = forward_tokens(ours, ids, lora=LoRASet.build(ours, adapter))
    close(with_lora, forward_tokens(merged, ids))
    close(with_lora, peft_logits[:, : ours.vocab_size])
    assert (with_lora - plain).abs().max() > 1.0  # the adapter really changes the output


def test_generator_greedy_equals_merged_model(model, tiny_folder, adapters, tmp_path):
    merged = Model.load(merge_by_hand(tiny_folder, tmp_path / "merged", [(adapters["all"], 1.0)]))
    gen = make_gen(model, tiny_folder)
    ids = prompt_ids(37)
    base_tokens, _ = run(gen, ids, 24)
    gen.set_loras(adapters["all"])
    assert [a.name for a in gen.loras] == ["all"] and gen.metrics()["loras"] == ["all"]
    tokens, _ = run(gen, ids, 24)
    assert tokens == run(make_gen(merged, tiny_folder), ids, 24)[0]
    assert tokens != base_tokens


def test_rslora_scaling_matches_peft(model, tiny_folder, adapters):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lora = LoRA.load(adapters["rs"], model)
    assert lora.use_rslora and all(s == pytest.approx(8 / math.sqrt(4)) for _, _, s in lora.weights.values())
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32),
                                           adapters["rs"])
    ids = prompt_ids(20, seed=3)
    with torch.no_grad():
        expected = peft_model(ids).logits[0, :, : model.vocab_size]
    close(forward_tokens(model, ids, lora=LoRASet.build(model, lora)), expected)


def test_scales_and_two_adapters_equal_hand_merge(model, tiny_folder, adapters, tmp_path):
    ids = prompt_ids(30, seed=4)
    pairs = [(adapters["all"], 0.7), (adapters["qv"], -0.5)]
    merged = Model.load(merge_by_hand(tiny_folder, tmp_path / "two", pairs))
    two = LoRASet.build(model, [p for p, _ in pairs], [s for _, s in pairs])
    close(forward_tokens(model, ids, lora=two), forward_tokens(merged, ids))

    half = Model.load(merge_by_hand(tiny_folder, tmp_path / "half", [(adapters["all"], 0.5)]))
    half_set = LoRASet.build(model, LoRA.load(adapters["all"], model), 0.5)
    close(forward_tokens(model, ids, lora=half_set), forward_tokens(half, ids))

    base = forward_tokens(Model.load(tiny_folder), ids)
    close(forward_tokens(model, ids, lora=LoRASet.build(model, adapters["all"], 0.0)), base)


def test_bin_weights_load_like_safetensors(model, tiny_folder, tmp_path):
    st = write_peft_adapter(tiny_folder, tmp_path / "st", seed=5)
    pt = write_peft_adapter(tiny_folder, tmp_path / "pt", seed=5, bin=True)
    assert (pt / "adapter_model.bin").is_file() and not (pt / "adapter_model.safetensors").exists()
    a, b = LoRA.load(st, model), LoRA.load(pt, model)
    assert a.weights.keys() == b.weights.keys() and len(a.weights) == 2 * len(ALL)
    for key in a.weights:
        torch.testing.assert_close(a.delta(*key), b.delta(*key), rtol=0, atol=0)


def test_identity_separates_adapter_sets(model, adapters):
    one = LoRASet.build(model, adapters["all"])
    again = LoRASet.build(model, [LoRA.load(adapters["all"], model)], [1.0])
    assert hash(one.identity()) == hash(again.identity()) and repr(one.identity()) == repr(again.identity())
    others = [LoRASet.build(model, adapters["all"], 0.5), LoRASet.build(model, adapters["qv"]),
              LoRASet.build(model, [adapters["all"], adapters["qv"]])]
    assert len({repr(s.identity()) for s in [one, *others]}) == 4
    assert LoRASet.build(model, None) is None and LoRASet.build(model, []) is None


# ---------------------------------------------------------------- generator integration

def test_set_loras_refused_while_jobs_queued_or_running(model, tiny_folder, adapters):
    gen = make_gen(model, tiny_folder)
    job = DynamicJob(prompt_ids(20), 8, gen_settings=GREEDY)
    gen.enqueue(job)
    with pytest.raises(RuntimeError, match="jobs"):
        gen.set_loras(adapters["all"])  # queued
    gen.iterate()
    assert job in gen.active
    with pytest.raises(RuntimeError, match="jobs"):
        gen.set_loras(adapters["all"])  # running
    assert gen.loras == []
    while gen.num_remaining_jobs():
        gen.iterate()
    gen.set_loras(adapters["all"])
    assert gen.loras
    with pytest.raises(ValueError):  # a bad adapter leaves the active set as it was
        gen.set_loras([adapters["all"], adapters["qv"]], [1.0])
    assert [a.name for a in gen.loras] == ["all"]


def test_page_cache_is_never_shared_across_adapter_sets(model, tiny_folder, adapters):
    gen = make_gen(model, tiny_folder)
    ids = prompt_ids(40, seed=6)  # two full pages of 16 and a partial one
    base, first = run(gen, ids)
    _, second = run(gen, ids)
    assert first["cached_tokens"] == 0 and second["cached_tokens"] >= 32  # the prompt cache works

    gen.set_loras(adapters["all"])
    with_lora, r = run(gen, ids)
    assert r["cached_tokens"] == 0
    default = LoRASet(model, gen.loras, [scale for _, scale in gen.adapters.default])
    oracle = forward_tokens(model, ids, lora=default)[-1].argmax().item()
    assert with_lora[0] == oracle and with_lora != base
    assert run(gen, ids)[1]["cached_tokens"] >= 32  # same set again: its own pages are reused

    gen.set_loras(adapters["all"], 0.5)  # same adapter, other scale: other K/V
    assert run(gen, ids)[1]["cached_tokens"] == 0

    gen.set_loras(None)
    again, r = run(gen, ids)
    assert r["cached_tokens"] >= 32 and again == base


def run_side_by_side(jobs: dict[DynamicGenerator, list[DynamicJob]]) -> dict[DynamicJob, list[int]]:
    """Step several generators in turn, all with jobs in flight; tokens per job."""
    tokens: dict[DynamicJob, list[int]] = {}
    for gen, js in jobs.items():
        gen.enqueue(js)
    while any(gen.num_remaining_jobs() for gen in jobs):
        for gen in jobs:
            for r in gen.iterate():
                if r["stage"] == "streaming":
                    tokens.setdefault(r["job"], []).extend(r["token_ids"])
    return tokens


def test_two_generators_on_one_model_keep_their_own_adapters_and_pages(model, tiny_folder, adapters, tmp_path):
    """Adapters are per generator, never on the shared Model: each generator keeps its own set and cache identity."""
    merged_all = make_gen(Model.load(merge_by_hand(tiny_folder, tmp_path / "m_all", [(adapters["all"], 1.0)])),
                          tiny_folder)
    merged_qv = make_gen(Model.load(merge_by_hand(tiny_folder, tmp_path / "m_qv", [(adapters["qv"], 1.0)])),
                         tiny_folder)
    ids = prompt_ids(40, seed=8)
    want_all, want_qv = run(merged_all, ids)[0], run(merged_qv, ids)[0]
    a, b = make_gen(model, tiny_folder), make_gen(model, tiny_folder)
    base, first = run(b, ids)
    a.set_loras(adapters["all"])  # B's model is A's model: B must not notice
    again, second = run(b, ids)
    assert again == base and second["cached_tokens"] >= 32 and b.metrics()["loras"] == []
    with_all, r = run(a, ids)
    assert with_all == want_all != base and r["cached_tokens"] == 0 and a.metrics()["loras"] == ["all"]

    b.set_loras(adapters["qv"])  # both adapted, differently, running in the same steps
    jobs = {a: [DynamicJob(ids, 16, gen_settings=GREEDY)], b: [DynamicJob(ids, 16, gen_settings=GREEDY)]}
    got = run_side_by_side(jobs)
    assert got[jobs[a][0]] == want_all and got[jobs[b][0]] == want_qv
    a.set_loras(None)
    jobs = {a: [DynamicJob(ids, 16, gen_settings=GREEDY)], b: [DynamicJob(ids, 16, gen_settings=GREEDY)]}
    got = run_side_by_side(jobs)
    assert got[jobs[a][0]] == base and got[jobs[b][0]] == want_qv


def test_adapters_are_never_model_state(model, tiny_folder, adapters):
    ids = prompt_ids(20, seed=9)
    lora = LoRASet.build(model, adapters["all"])
    plain = forward_tokens(model, ids)
    assert (forward_tokens(model, ids, lora=lora) - plain).abs().max() > 1.0
    torch.testing.assert_close(forward_tokens(model, ids), plain, rtol=0, atol=0)  # nothing stayed behind
    with pytest.raises(AttributeError, match="lora="):
        model.lora = lora  # the old way would now be silently ignored: refuse it
    assert getattr(model, "lora", None) is None
    gen = make_gen(model, tiny_folder)
    with pytest.raises(ValueError, match="already serves another DynamicGenerator"):
        DynamicGenerator(model, gen.cache, gen.tokenizer)  # two page tables over one pool


# ---------------------------------------------------------------- bad adapters

def _edit_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("changes, message", [
    ({"bias": "all"}, "bias"),
    ({"bias": "lora_only"}, "bias"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "embed_tokens"),
    ({"target_modules": ["lm_head"]}, "lm_head"),
    ({"peft_type": "IA3"}, "IA3"),
    ({"r": 8}, "rank 4"),  # weights are rank 4
])
def test_unsupported_configs_are_refused(model, adapters, tmp_path, changes, message):
    bad = _edit_config(adapters["all"], tmp_path / "bad", **changes)
    with pytest.raises(ValueError, match=message):
        LoRA.load(bad, model)


def test_unsupported_tensors_are_refused(model, adapters, tmp_path):
    bad = _edit_config(adapters["all"], tmp_path / "bad")
    tensors = load_file(bad / "adapter_model.safetensors")
    tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = torch.zeros(4, 10)
    save_file(tensors, bad / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="embed_tokens"):
        LoRA.load(bad, model)


def test_adapters_for_other_base_models_are_refused(model, tmp_path):
    deeper = write_tiny_model(tmp_path / "deep", num_hidden_layers=3)
    with pytest.raises(ValueError, match="layer 2.*2 layers"):
        LoRA.load(write_peft_adapter(deeper, tmp_path / "a_deep"), model)
    wider = write_tiny_model(tmp_path / "wide", intermediate_size=96)
    with pytest.raises(ValueError, match="shape mismatch"):
        LoRA.load(write_peft_adapter(wider, tmp_path / "a_wide", targets=["down_proj"]), model)
    other = Model.load(wider)
    fits_other = LoRA.load(write_peft_adapter(wider, tmp_path / "a_other", targets=["q_proj"]), other)
    with pytest.raises(ValueError, match="different model"):
        LoRASet.build(model, fits_other)  # a LoRA object loaded for another model's shapes


def test_missing_files_and_bad_arguments(model, adapters, tmp_path):
    with pytest.raises(MissingAdapterFile, match="does not exist"):
        LoRA.load(tmp_path / "nowhere", model)
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingAdapterFile, match="adapter_config.json"):
        LoRA.load(tmp_path / "empty", model)
    no_weights = _edit_config(adapters["all"], tmp_path / "no_weights")
    (no_weights / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights"):
        LoRA.load(no_weights, model)
    with pytest.raises(ValueError, match="2 LoRA scales for 1"):
        LoRASet.build(model, adapters["all"], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        LoRASet.build(model, adapters["all"], float("nan"))
    with pytest.raises(TypeError):
        LoRASet.build(model, 42)
    assert find_adapters(adapters["all"].parent) == sorted(adapters.values())


# ---------------------------------------------------------------- the demo adapters (real default model)

DEMO = demo_adapters_folder()  # the checkout's resources/loras (wrong if this finds no demo adapters)


def test_demo_adapters_are_small_peft_adapters():
    folders = find_adapters(DEMO)
    assert {f.name for f in folders} >= {"pirate", "bullets"}
    for folder in folders:
        cfg = json.loads((folder / "adapter_config.json").read_text())
        assert cfg["peft_type"] == "LORA" and cfg["r"] <= 16
        assert (folder / "adapter_model.safetensors").stat().st_size < 5 * 2**20


@pytest.fixture(scope="module")
def default_chat():
    model, tok = Model.load(), Tokenizer.load()
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=2048), tok)

    def reply(question: str) -> str:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]), encode_special_tokens=True)
        gen.enqueue(DynamicJob(ids, 64, gen_settings=GREEDY, stop_conditions=[tok.eos_token_id, "<|im_end|>"]))
        text = ""
        while gen.num_remaining_jobs():
            text += "".join(r["text"] for r in gen.iterate() if r["stage"] == "streaming")
        return text

    yield gen, reply


def _bullet_lines(text: str) -> int:
    return sum(line.lstrip().startswith(("- ", "* ", "\u2022")) for line in text.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("question", ["What should I cook for dinner tonight?", "Why do leaves change colour?"])
def test_demo_adapters_change_the_chat_style(default_chat, question):
    gen, reply = default_chat  # questions the training script never used
    gen.set_loras(None)
    base = reply(question)
    gen.set_loras(DEMO / "bullets")
    bullets = reply(question)
    gen.set_loras(DEMO / "pirate")
    pirate = reply(question)
    gen.set_loras(None)
    assert reply(question) == base  # swapping back restores the base model exactly
    assert _bullet_lines(base) == 0 and _bullet_lines(bullets) >= 2, (base, bullets)
    pirate_words = ("arr", "matey", "ahoy", "me hearty", " ye ", "th' ")
    assert not any(w in base.lower() for w in pirate_words), base
    assert pirate.lower().startswith(("arr", "ahoy")) and sum(w in pirate.lower() for w in pirate_words) >= 2, pirate
