"""The text side of vision-language models against transformers: pagedeck loads the language model of a
tiny Idefics3 (SmolVLM) and Gemma 3 VLM folder, builds the prompt of a chat with an image (the model's chat
template, the processor's image-marker expansion), takes the image features from transformers, and its
logits match the full HF model's.

Tolerance: both run fp32 with the same ops on the same inputs; only summation order differs (SDPA vs
pagedeck's paged attention, fused q|k|v), measured ~1e-5 absolute on logits of magnitude ~10. Bounds:
2e-4 absolute + 1e-4 relative, far below what any real difference (a wrong position, a missing scale, a
causal image run in Gemma 3: ~2.5 absolute here) gives.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer, image_prompt
from engine.generator.embeddings import FIRST_ID
from engine.model.batch import Batch
from engine.generator.mm_inputs import step_inputs
from engine.generator.sequence import ScheduledSeq, Sequence
from tests.engine.pagetable_checks import check_released
from tests.tiny_vlms import (GEMMA3_IMAGE_TOKENS, IDEFICS3_TEMPLATE, write_tiny_gemma3_vlm, write_tiny_idefics3)

ATOL, RTOL = 2e-4, 1e-4
PAGE = 16


def image(seed: int, h: int = 100, w: int = 90):
    from PIL import Image

    return Image.fromarray((np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8))


class HFIdefics3Vision:
    """The vision side done by transformers (its image processor and get_image_features): what the vision
    helper's encoder must reproduce; here it feeds pagedeck's text side."""

    identity = "tiny-idefics3-hf"

    def __init__(self, hf):
        from transformers import Idefics3ImageProcessorPil

        self.hf = hf
        self.processor = Idefics3ImageProcessorPil(size={"longest_edge": 128}, max_image_size={"longest_edge": 64},
                                                   do_image_splitting=True)

    @torch.no_grad()
    def encode(self, img):
        out = self.processor(images=[[img]], return_row_col_info=True, return_tensors="pt")
        feats = self.hf.get_image_features(pixel_values=out["pixel_values"],
                                           pixel_attention_mask=out["pixel_attention_mask"]).pooler_output
        return [({"rows": out["rows"][0][0], "cols": out["cols"][0][0]}, torch.cat(list(feats)))]


class HFGemma3Vision:
    identity = "tiny-gemma3-hf"

    def __init__(self, hf):
        from transformers import Gemma3ImageProcessorPil

        self.hf = hf
        self.processor = Gemma3ImageProcessorPil(size={"height": 64, "width": 64})

    @torch.no_grad()
    def encode(self, img):
        pv = self.processor(images=[img], return_tensors="pt")["pixel_values"]
        return [(None, self.hf.get_image_features(pixel_values=pv).pooler_output.reshape(-1, 64))]


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory):
    path, hf = write_tiny_idefics3(tmp_path_factory.mktemp("vlm") / "idefics3")
    return path, hf, Model.load(path, device="cpu", dtype=torch.float32), Tokenizer.load(path)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path, hf = write_tiny_gemma3_vlm(tmp_path_factory.mktemp("vlm") / "gemma3")
    return path, hf, Model.load(path, device="cpu", dtype=torch.float32), Tokenizer.load(path)


def all_logits(model, ids: list[int], embeddings) -> torch.Tensor:
    """Logits of every position in one forward, the embeddings substituted as the generator does."""
    cache = PagedCache(model, max_tokens=-(-len(ids) // PAGE) * PAGE, page_size=PAGE)
    seq = Sequence(tokens=list(ids), prompt_len=len(ids))

    class Job:  # what step_inputs reads from a job
        pass

    from engine.generator.embeddings import EmbeddingLookup

    job = Job()
    job.embeddings = EmbeddingLookup(embeddings)
    batch = Batch.build([(ids, 0, list(range(cache.num_pages)))], PAGE, [len(ids)], model.device, [True])
    batch.mm_rows, batch.mm_vectors, batch.mm_blocks = step_inputs(
        [ScheduledSeq(job, seq, ids, 0, len(ids), prefill=True)], model.bidirectional_images, model.device)
    return model.forward(batch, cache, None, model.rotary_for(len(ids)))[:, : model.vocab_size]


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def chat(img, text="What is in this picture?"):
    return [{"role": "system", "content": "You describe images."},
            {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": text}]}]


def test_loaders_read_the_language_model_of_vlm_folders(idefics3, gemma3):
    for path, hf, model, _ in (idefics3, gemma3):
        text = hf.config.text_config
        assert (model.config.hidden_size, model.config.num_layers, model.vocab_size) == (
            text.hidden_size, text.num_hidden_layers, text.vocab_size)
        torch.testing.assert_close(model.embed[: model.vocab_size], hf.get_input_embeddings().weight, atol=0, rtol=0)
        head = model.lm_head[: model.vocab_size]
        torch.testing.assert_close(head, hf.lm_head.weight, atol=0, rtol=0)
    assert idefics3[2].config.arch == "llama" and gemma3[2].config.arch == "gemma3"
    assert gemma3[2].config.tie_word_embeddings and not idefics3[2].config.tie_word_embeddings
    assert gemma3[2].bidirectional_images and not idefics3[2].bidirectional_images


def test_a_tied_idefics3_head_is_its_embedding(tmp_path):
    path, hf = write_tiny_idefics3(tmp_path / "tied", tie=True)
    model = Model.load(path, device="cpu", dtype=torch.float32)
    assert model.config.tie_word_embeddings
    torch.testing.assert_close(model.lm_head[: model.vocab_size], hf.lm_head.weight, atol=0, rtol=0)


def test_idefics3_chat_with_an_image_matches_the_processor_and_the_full_model(idefics3):
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor, PreTrainedTokenizerFast

    path, hf, model, tok = idefics3
    img = image(0)  # 100 x 90: split into 2 x 2 tiles of 64 plus the global view
    ids, embs = image_prompt(chat(img), tok, HFIdefics3Vision(hf))
    assert len(embs) == 1 and embs[0].length == 5 * 16

    proc = Idefics3Processor(image_processor=Idefics3ImageProcessorPil(
        size={"longest_edge": 128}, max_image_size={"longest_edge": 64}, do_image_splitting=True),
        tokenizer=PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json")), image_seq_len=16,
        chat_template=IDEFICS3_TEMPLATE)
    shaped = [{**m, "content": [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else
               [{"type": p["type"], **({"text": p["text"]} if p["type"] == "text" else {})} for p in m["content"]]}
              for m in chat(img)]
    enc = proc(text=proc.apply_chat_template(shaped, add_generation_prompt=True), images=[[img]],
               return_tensors="pt", add_special_tokens=False)
    ref_ids = enc["input_ids"][0].tolist()
    is_image = [t == hf.config.image_token_id for t in ref_ids]
    assert ids[0].tolist() == [e if not im else ours for e, im, ours in zip(ref_ids, is_image, ids[0].tolist())]
    assert [t >= FIRST_ID for t in ids[0].tolist()] == is_image
    with torch.no_grad():
        ref = hf(**enc).logits[0]
    close(all_logits(model, ids[0].tolist(), embs), ref)


def test_gemma3_chat_with_an_image_matches_the_full_model_bidirectional_image(gemma3):
    path, hf, model, tok = gemma3
    img = image(1)
    ids, embs = image_prompt(chat(img, "Describe it."), tok, HFGemma3Vision(hf))
    ids = ids[0].tolist()
    text = tok.decode([t if t < FIRST_ID else tok.token_to_id("<image_soft_token>") for t in ids], True)
    # the Gemma 3 processor's expansion of the template's <start_of_image>
    assert "<start_of_turn>user\n\n\n<start_of_image>" + "<image_soft_token>" * GEMMA3_IMAGE_TOKENS + \
           "<end_of_image>\n\nDescribe it.<end_of_turn>" in text
    image_id = hf.config.image_token_id
    hf_ids = torch.tensor([[image_id if t >= FIRST_ID else t for t in ids]])
    pv = HFGemma3Vision(hf).processor(images=[img], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        ref = hf(input_ids=hf_ids, pixel_values=pv, token_type_ids=(hf_ids == image_id).long()).logits[0]
        causal = hf(input_ids=hf_ids, pixel_values=pv).logits[0]
    ours = all_logits(model, ids, embs)
    close(ours, ref)
    assert (ours - causal).abs().max() > 100 * ATOL  # the image's bidirectional attention matters here


def test_gemma3_generator_keeps_an_image_in_one_prefill_chunk(gemma3):
    """Chunks of 8 tokens would split the 16-token image; the generator extends the chunk to the image's end,
    so the first sampled token's logits equal the full model's last logits."""
    path, hf, model, tok = gemma3
    img = image(2)
    ids, embs = image_prompt(chat(img, "Describe it."), tok, HFGemma3Vision(hf))
    ref = all_logits(model, ids[0].tolist(), embs)[-1]
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=256, page_size=PAGE), tok, max_chunk_size=8,
                           prefill_share=None)
    job = DynamicJob(ids, 3, gen_settings=SamplerSettings.greedy(), embeddings=embs, return_logits=True)
    gen.enqueue(job)
    first = None
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming" and first is None:
                first = r["logits"][0]
    close(first[: model.vocab_size], ref)
    check_released(gen.pagetable)


def test_idefics3_greedy_generation_matches_transformers(idefics3):
    path, hf, model, tok = idefics3
    img = image(3, 50, 60)
    vision = HFIdefics3Vision(hf)
    ids, embs = image_prompt(chat(img), tok, vision)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=512, page_size=PAGE), tok)
    job = DynamicJob(ids, 8, gen_settings=SamplerSettings.greedy(), embeddings=embs)
    gen.enqueue(job)
    tokens = []
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                tokens += r["token_ids"]
    feats = vision.encode(img)[0][1]
    seq = torch.tensor([[hf.config.image_token_id if t >= FIRST_ID else t for t in ids[0].tolist()]])
    n = seq.shape[1]
    with torch.no_grad():
        for _ in range(8):  # greedy by full re-forward, the image features scattered in as transformers does
            emb = hf.get_input_embeddings()(seq)
            emb[seq == hf.config.image_token_id] = feats
            seq = torch.cat([seq, hf(inputs_embeds=emb).logits[0, -1].argmax().view(1, 1)], dim=1)
    assert tokens == seq[0, n:].tolist()


class CountingVision:
    """Counts encode calls of the transformers-backed encoder it wraps."""

    def __init__(self, inner, identity):
        self.inner, self.identity, self.calls = inner, identity, 0

    def encode(self, img):
        self.calls += 1
        return self.inner.encode(img)


def test_history_images_are_encoded_once_and_keep_their_ids(idefics3):
    path, hf, model, tok = idefics3
    vision = CountingVision(HFIdefics3Vision(hf), "counting-idefics3")
    img = image(5)
    first_ids, (first,) = image_prompt(chat(img), tok, vision)
    history = chat(img) + [{"role": "assistant", "content": "A pattern."}, {"role": "user", "content": "Colours?"}]
    ids, (again,) = image_prompt(history, tok, vision)
    assert vision.calls == 1 and again.token_ids == first.token_ids
    assert ids[0, : first_ids.shape[1] - 3].tolist() == first_ids[0, :-3].tolist()  # the turn so far, then more
    other = CountingVision(HFIdefics3Vision(hf), "another-encoder")
    _, (theirs,) = image_prompt(chat(img), tok, other)
    assert other.calls == 1 and not set(theirs.token_ids) & set(first.token_ids)


class Tokens:
    """The shape of engine.vision.ImageTokens: one run of placeholders with the text around it."""

    def __init__(self, before, placeholder, embeddings, after=""):
        self.before, self.placeholder, self.embeddings, self.after = before, placeholder, embeddings, after


class HFVisionAsImageTokens:
    """The transformers-backed encoders in engine.vision.VisionEncoder's shape (kind, content_hash, encode ->
    ImageTokens per tile), the texts written from transformers' Idefics3 / Gemma 3 processor strings."""

    def __init__(self, inner, kind):
        self.inner, self.kind = inner, kind

    def content_hash(self, img) -> str:
        import hashlib

        return hashlib.sha256(b"hf-" + self.kind.encode() + img.tobytes()).hexdigest()

    def encode(self, img):
        (layout, feats), = self.inner.encode(img)
        if self.kind == "gemma3":
            return [Tokens("\n\n<start_of_image>", "<image_soft_token>", feats, "<end_of_image>\n\n")]
        rows, cols = layout["rows"], layout["cols"]
        tiles = feats.split(16)
        fake = "<fake_token_around_image>"
        out = [Tokens(f"{fake}<row_{r + 1}_col_{c + 1}>", "<image>", tiles[r * cols + c], "\n" if c == cols - 1 else "")
               for r in range(rows) for c in range(cols)]
        return out + [Tokens(f"\n{fake}<global-img>", "<image>", tiles[-1], fake)]


@pytest.mark.parametrize("kind", ["idefics3", "gemma3"])
def test_engine_vision_image_tokens_give_the_same_prompt(kind, idefics3, gemma3):
    path, hf, model, tok = idefics3 if kind == "idefics3" else gemma3
    pairs = HFIdefics3Vision(hf) if kind == "idefics3" else HFGemma3Vision(hf)
    img = image(6)
    ids, embs = image_prompt(chat(img), tok, pairs, cache=None)
    ids2, embs2 = image_prompt(chat(img), tok, HFVisionAsImageTokens(pairs, kind), family=None, cache=None)
    assert [t >= FIRST_ID for t in ids2[0].tolist()] == [t >= FIRST_ID for t in ids[0].tolist()]
    assert [t for t in ids2[0].tolist() if t < FIRST_ID] == [t for t in ids[0].tolist() if t < FIRST_ID]
    torch.testing.assert_close(embs2[0].embeddings, embs[0].embeddings, atol=0, rtol=0)
    assert not set(embs2[0].token_ids) & set(embs[0].token_ids)  # other encoder identity: other ids


@pytest.mark.parametrize("kind", ["idefics3", "gemma3"])
def test_engine_vision_encoder_end_to_end(kind, idefics3, gemma3):
    """engine.vision's own encoder (loaded from the folder) -> image_prompt -> pagedeck's text side: the
    full transformers model's logits (the branch that brings engine.vision runs this)."""
    vision_pkg = pytest.importorskip("engine.vision")
    from transformers import Gemma3ImageProcessorPil, Idefics3ImageProcessorPil

    path, hf, model, tok = idefics3 if kind == "idefics3" else gemma3
    if kind == "idefics3":
        processor = Idefics3ImageProcessorPil(size={"longest_edge": 128}, max_image_size={"longest_edge": 64},
                                              do_image_splitting=True)
    else:
        processor = Gemma3ImageProcessorPil(size={"height": 64, "width": 64})
    processor.save_pretrained(path)
    img = image(7)
    ids, embs = image_prompt(chat(img), tok, vision_pkg.load_vision(path))
    hf_ids = torch.tensor([[hf.config.image_token_id if t >= FIRST_ID else t for t in ids[0].tolist()]])
    with torch.no_grad():
        if kind == "idefics3":
            pixels = processor(images=[[img]], return_tensors="pt")
            ref = hf(input_ids=hf_ids, pixel_values=pixels["pixel_values"],
                     pixel_attention_mask=pixels["pixel_attention_mask"]).logits[0]
        else:
            pv = processor(images=[img], return_tensors="pt")["pixel_values"]
            ref = hf(input_ids=hf_ids, pixel_values=pv, token_type_ids=(hf_ids == hf.config.image_token_id).long()).logits[0]
    close(all_logits(model, ids[0].tolist(), embs), ref)
