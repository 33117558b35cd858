"""The architecture features beyond Llama (Gemma 1/2/3, Phi-3, sliding windows) against transformers:
through the paged generator (chunked prefill, batched decode, windows crossing page and chunk borders),
each feature shown to matter, and Gemma 3's multimodal checkpoints read for their text decoder."""

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings
from tests.engine.test_model_peer import TINY_ATOL, greedy_hf, hf_logits, hf_model, prompt_ids
from tests.tiny_models import ARCHS, default_tokenizer, tiny_config, write_tiny_model


def generate_batched(model, prompts, steps, **kw):
    """Greedy tokens of several prompts run together through the paged generator, 16-token chunks."""
    cache = PagedCache(model, max_tokens=1024, page_size=16)
    gen = DynamicGenerator(model, cache, default_tokenizer(), max_chunk_size=16, **kw)
    jobs = [DynamicJob(p, steps, gen_settings=SamplerSettings.greedy()) for p in prompts]
    tokens = {id(j): [] for j in jobs}
    gen.enqueue(jobs)
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens[id(r["job"])] += r["token_ids"]
    return [tokens[id(j)] for j in jobs]


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
    generate_batched(model, [prompt_ids(5)], 1, max_seq_len=64)
    assert torch.equal(model.inv_freq, short)
    generate_batched(model, [prompt_ids(5)], 1)  # cache of 1024 tokens > 64
    assert torch.equal(model.inv_freq, long)


def _max_diff(model, ids, expected):
    return (model.forward_tokens(ids) - expected).abs().max().item()


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
    local, ours.sliding_inv_freq = ours.sliding_inv_freq, ours.inv_freq
    assert _max_diff(ours, ids, expected) > 100 * TINY_ATOL
    ours.sliding_inv_freq = local
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
