"""The architecture features beyond Llama (Gemma 1/2/3, Phi-3, sliding windows) against transformers:
through the paged generator (chunked prefill, batched decode, windows crossing page and chunk borders),
each feature shown to matter, and Gemma 3's multimodal checkpoints read for their text decoder."""

import dataclasses

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings
from tests.engine.test_model_peer import TINY_ATOL, greedy_hf, hf_logits, hf_model, prompt_ids
from tests.tiny_models import ARCHS, default_tokenizer, tiny_config, write_tiny_model
from tools.logits import forward_tokens


def batched_run(model, prompts, steps, **kw):
    """A paged generator (16-token chunks) with greedy jobs of several prompts queued, and a step function
    that runs one step and collects each job's tokens; returns (generator, step, tokens per prompt)."""
    cache = PagedCache(model, max_tokens=1024, page_size=16)
    gen = DynamicGenerator(model, cache, default_tokenizer(), max_chunk_size=16, **kw)
    jobs = [DynamicJob(p, steps, gen_settings=SamplerSettings.greedy()) for p in prompts]
    tokens = {id(j): [] for j in jobs}
    gen.enqueue(jobs)

    def step():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens[id(r["job"])] += r["token_ids"]

    return gen, step, [tokens[id(j)] for j in jobs]


def generate_batched(model, prompts, steps, **kw):
    """Greedy tokens of several prompts run together through the paged generator, 16-token chunks."""
    gen, step, tokens = batched_run(model, prompts, steps, **kw)
    while gen.num_remaining_jobs():
        step()
    return tokens


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gemma3", "phi3-long"])
def test_paged_generation_with_sliding_windows_matches_transformers(tmp_path, arch):
    """Windows of 16-24 tokens under 30-44-token prompts and 20 new tokens: every decode step and every
    later prefill chunk reads through a window that starts mid-page."""
    folder = write_tiny_model(tmp_path / arch, arch, seed=ARCHS.index(arch))
    ours, theirs = Model.load(folder, device="cpu", dtype=torch.float32), hf_model(folder)
    prompts = [prompt_ids(n, seed=n) for n in (30, 37, 44)]
    # LongRoPE: transformers' generate switches rope sets mid-sequence past 64 tokens, so stay within them
    kw = {"max_seq_len": 64} if arch == "phi3-long" else {}
    got = generate_batched(ours, prompts, 20, **kw)
    for p, tokens in zip(prompts, got):
        assert tokens == greedy_hf(theirs, p, 20)


def test_long_rope_is_chosen_by_the_generators_context():
    """Phi-3's long factors serve contexts past original_max_position_embeddings (llama.cpp's rule)."""
    from engine.model.config import ModelConfig
    from engine.bench.synthetic import random_model

    model = random_model(ModelConfig.from_hf(tiny_config("phi3-long").to_dict()), "cpu", torch.float32)
    short, long = model.config.rope_inv_freq(), model.config.rope_inv_freq(long=True)
    assert not torch.equal(short, long)
    within, *_ = batched_run(model, [prompt_ids(5)], 1, max_seq_len=64)
    assert torch.equal(within.rotary.inv_freq, short)
    beyond, *_ = batched_run(model, [prompt_ids(5)], 1)  # cache of 1024 tokens > 64
    assert torch.equal(beyond.rotary.inv_freq, long)
    assert torch.equal(within.rotary.inv_freq, short)  # the second generator changed nothing of the first's


def test_generators_sharing_a_model_step_as_each_alone(tmp_path):
    """A Model is shared: two generators with different context lengths (LongRoPE's short and long sets),
    stepped in turn, give what each gives alone, and no forward changes anything on the model."""
    model = Model.load(write_tiny_model(tmp_path / "phi3", "phi3-long"), device="cpu", dtype=torch.float32)
    prompts = [prompt_ids(n, seed=n) for n in (30, 37)]
    alone = [generate_batched(model, prompts, 12, max_seq_len=64), generate_batched(model, prompts, 12)]
    assert alone[0] != alone[1]  # the two rope sets differ enough to change greedy tokens
    before = dict(vars(model))
    runs = [batched_run(model, prompts, 12, max_seq_len=64), batched_run(model, prompts, 12)]
    while any(gen.num_remaining_jobs() for gen, _, _ in runs):
        for gen, step, _ in runs:
            if gen.num_remaining_jobs():
                step()
    assert [tokens for _, _, tokens in runs] == alone
    forward_tokens(model, prompts[0])
    assert vars(model).keys() == before.keys() and all(vars(model)[k] is v for k, v in before.items())


def _max_diff(model, ids, expected):
    return (forward_tokens(model, ids) - expected).abs().max().item()


def test_gemma2_features_each_matter(tmp_path):
    """Soft-capping (strong here: 2.0 and 3.0), query_pre_attn_scalar != head_dim, the sliding window
    and the sandwich norms: ours matches transformers, and dropping any one breaks the match."""
    folder = write_tiny_model(tmp_path / "g2", "gemma2", attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                              query_pre_attn_scalar=24)
    ours = Model.load(folder, device="cpu", dtype=torch.float32)
    ids = prompt_ids(40, seed=3)
    expected = hf_logits(hf_model(folder), ids)
    assert _max_diff(ours, ids, expected) < TINY_ATOL
    c = ours.config
    for field, off in (("attn_softcap", None), ("final_softcap", None)):
        saved = getattr(c, field)
        setattr(c, field, off)
        assert _max_diff(ours, ids, expected) > 100 * TINY_ATOL, field
        setattr(c, field, saved)
    ours.scale = 16 ** -0.5
    assert _max_diff(ours, ids, expected) > 100 * TINY_ATOL
    ours.scale = c.attn_scale
    ours.layers[0].window = None
    assert _max_diff(ours, ids, expected) > 100 * TINY_ATOL
    ours.layers[0].window = c.sliding_window
    norm, ours.layers[1].mlp_out_norm = ours.layers[1].mlp_out_norm, None
    assert _max_diff(ours, ids, expected) > 100 * TINY_ATOL
    ours.layers[1].mlp_out_norm = norm
    assert _max_diff(ours, ids, expected) < TINY_ATOL


def test_gemma3_local_rope_base_and_embedding_scale_matter(tmp_path):
    folder = write_tiny_model(tmp_path / "g3", "gemma3")
    ours = Model.load(folder, device="cpu", dtype=torch.float32)
    ids = prompt_ids(40, seed=3)
    expected = hf_logits(hf_model(folder), ids)
    assert _max_diff(ours, ids, expected) < TINY_ATOL
    rotary = ours.rotary_for(ids.shape[1])
    one_base = dataclasses.replace(rotary, sliding_inv_freq=rotary.inv_freq)
    assert (forward_tokens(ours, ids, rotary=one_base) - expected).abs().max().item() > 100 * TINY_ATOL
    ours.embed_scale = None
    assert _max_diff(ours, ids, expected) > 100 * TINY_ATOL


def test_gemma3_multimodal_checkpoint_loads_its_text_decoder(tmp_path):
    """Gemma 3 4B+ ship as Gemma3ForConditionalGeneration: config under text_config, weights under
    language_model.*, a vision tower beside them. The text decoder must give transformers' text logits."""
    import transformers

    text = tiny_config("gemma3")
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=32, patch_size=16)
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4)
    torch.manual_seed(0)
    mm = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in mm.named_parameters():
            p.normal_(0.0, 0.25 if p.dim() > 1 else 0.3)
    mm.save_pretrained(tmp_path / "mm")
    default_tokenizer().save(tmp_path / "mm")
    ours = Model.load(tmp_path / "mm", device="cpu", dtype=torch.float32)
    assert ours.config.arch == "gemma3" and ours.config.num_layers == 6
    ids = prompt_ids(30, seed=2)
    with torch.inference_mode():
        expected = mm(input_ids=ids).logits[0].float()
    assert _max_diff(ours, ids, expected) < TINY_ATOL
