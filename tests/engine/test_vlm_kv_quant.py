"""Gemma 3 images with a quantized K/V cache (kv_quant q8 / q6 / q4): the bidirectional image attention
reads the quantized pools dequantized, so an image chat runs and stays near transformers' logits.

The oracle is the full transformers model (unquantized K/V) with the image's bidirectional mask, beside the
same model run causally (what a missing bidirectional pass would give). Quantization adds its own error:
symmetric groups of 32 with one fp16 scale round each K/V value by up to half a step of max|x|/127 (q8),
/31 (q6), /7 (q4); measured on these logits (max |logit| ~2.8) as 0.04, 0.14, 0.72 over every position
from the image on. Bounds are ~2-4x that (0.15, 0.4, 1.2); and every format must stay closer to the
bidirectional reference than to the causal one (2.1 apart here), so a quantized run that dropped or
botched the image's both-ways attention fails even at q4.
"""
from __future__ import annotations

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer, image_prompt
from engine.generator.embeddings import FIRST_ID, EmbeddingLookup
from engine.generator.mm_inputs import step_inputs
from engine.generator.sequence import ScheduledSeq, Sequence
from engine.model.batch import Batch
from tests.engine.pagetable_checks import check_released
from tests.engine.test_vlm_text import PAGE, HFGemma3Vision, chat, image
from tests.tiny_vlms import write_tiny_gemma3_vlm

BOUNDS = {"q8": 0.15, "q6": 0.4, "q4": 1.2}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path, hf = write_tiny_gemma3_vlm(tmp_path_factory.mktemp("vlm") / "gemma3")
    return path, hf, Model.load(path, device="cpu", dtype=torch.float32), Tokenizer.load(path)


def all_logits(model, ids: list[int], embeddings, kv_quant: str | None) -> torch.Tensor:
    """Every position's logits in one forward through a cache of the given K/V format."""
    cache = PagedCache(model, max_tokens=-(-len(ids) // PAGE) * PAGE, page_size=PAGE, kv_quant=kv_quant)
    seq = Sequence(tokens=list(ids), prompt_len=len(ids))

    class Job:  # what step_inputs reads from a job
        pass

    job = Job()
    job.embeddings = EmbeddingLookup(embeddings)
    batch = Batch.build([(ids, 0, list(range(cache.num_pages)))], PAGE, [len(ids)], model.device, [True])
    batch.mm_rows, batch.mm_vectors, batch.mm_blocks = step_inputs(
        [ScheduledSeq(job, seq, ids, 0, len(ids), prefill=True)], model.bidirectional_images, model.device)
    assert batch.mm_blocks  # the image's run goes through the bidirectional pass
    return model.forward(batch, cache, None, model.rotary_for(len(ids)))[:, : model.vocab_size]


@pytest.fixture(scope="module")
def prompt(gemma3):
    path, hf, model, tok = gemma3
    img = image(1)
    ids, embs = image_prompt(chat(img, "Describe it."), tok, HFGemma3Vision(hf), cache=None)
    ids = ids[0].tolist()
    image_id = hf.config.image_token_id
    hf_ids = torch.tensor([[image_id if t >= FIRST_ID else t for t in ids]])
    pv = HFGemma3Vision(hf).processor(images=[img], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        ref = hf(input_ids=hf_ids, pixel_values=pv, token_type_ids=(hf_ids == image_id).long()).logits[0]
        causal = hf(input_ids=hf_ids, pixel_values=pv).logits[0]
    first = next(i for i, t in enumerate(ids) if t >= FIRST_ID)
    return ids, embs, ref, causal, first


@pytest.mark.parametrize("kv_quant", list(BOUNDS))
def test_gemma3_image_with_quantized_kv_matches_transformers(gemma3, prompt, kv_quant):
    model = gemma3[2]
    ids, embs, ref, causal, first = prompt
    ours = all_logits(model, ids, embs, kv_quant)[first:]
    err, causal_gap = (ours - ref[first:]).abs().max().item(), (ours - causal[first:]).abs().max().item()
    assert err < BOUNDS[kv_quant], (kv_quant, err)
    assert err < causal_gap / 2, (kv_quant, err, causal_gap)
    assert (ref - causal).abs().max() > 1.0  # the both-ways attention matters on this model
    if kv_quant == "q8":
        assert err > 1e-4  # the cache really was quantized


@pytest.mark.parametrize("kv_quant", ["q8", "q4"])
def test_gemma3_generator_with_quantized_kv_and_chunked_prefill(gemma3, prompt, kv_quant):
    """Through the generator, chunks of 8 (the 16-token image kept in one step): the first sampled token's
    logits equal the one-forward logits of the same quantized cache (quantizing per token, a chunked
    prefill writes the same codes), and the pages go back."""
    path, hf, model, tok = gemma3
    ids, embs, *_ = prompt
    one_shot = all_logits(model, ids, embs, kv_quant)[-1]
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=256, page_size=PAGE, kv_quant=kv_quant), tok,
                           max_chunk_size=8, prefill_share=None)
    gen.enqueue(DynamicJob(torch.tensor([ids]), 4, gen_settings=SamplerSettings.greedy(), embeddings=embs,
                           return_logits=True))
    first, tokens = None, []
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                first = r["logits"][0] if first is None else first
                tokens += r["token_ids"]
    assert len(tokens) == 4
    torch.testing.assert_close(first[: model.vocab_size], one_shot, atol=2e-4, rtol=1e-4)
    check_released(gen.pagetable)
