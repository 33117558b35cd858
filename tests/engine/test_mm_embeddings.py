"""Jobs with embeddings (images) in the generator: placeholder ids, batching beside text jobs, prefix sharing
by content, LoRA, speculative decoding, cancel and page pressure, and the torch-free prompt helpers.

The oracle for outputs is one full forward over the whole sequence with the vectors substituted
(test_vlm_text.all_logits; that path is checked against transformers there), re-run per greedy step.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, MMEmbedding, Model, PagedCache, SamplerSettings, Tokenizer
from engine import encode_with_embeddings
from engine.chat.image_prompt import IDEFICS3, GEMMA3, expand_markers, fill_image_tokens, grid, split_images
from engine.generator.embeddings import FIRST_ID
from tests.engine.pagetable_checks import check_released, check_table, live_sequences
from tests.engine.test_vlm_text import all_logits
from tests.tiny_models import write_tiny_model

GREEDY = SamplerSettings.greedy()
PAGE = 16


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return Model.load(tiny_llama_folder, device="cpu", dtype=torch.float32), Tokenizer.load(tiny_llama_folder)


def features(seed: int, n: int = 40) -> torch.Tensor:
    """Vectors on the scale of the tiny model's token embeddings (std 0.25), as a projector would give."""
    return torch.randn((n, 64), generator=torch.Generator().manual_seed(seed)) * 0.25


def text_ids(n: int, seed: int) -> list[int]:
    return torch.randint(10, 40000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def prompt(before: list[int], emb: MMEmbedding, after: list[int]) -> torch.Tensor:
    return torch.tensor([before + emb.token_ids + after])


def make_gen(tiny, max_tokens=1024, **kw) -> DynamicGenerator:
    model, tok = tiny
    return DynamicGenerator(model, PagedCache(model, max_tokens=max_tokens, page_size=PAGE), tok, **kw)


def run(gen, jobs, each_step=None):
    out = {id(j): [] for j in jobs}
    final = {}
    gen.enqueue(list(jobs))
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                out[id(r["job"])] += r["token_ids"]
                if r["eos"]:
                    final[id(r["job"])] = r
        if each_step is not None:
            each_step(gen)
    return [out[id(j)] for j in jobs], [final[id(j)] for j in jobs]


def greedy_oracle(model, ids: list[int], embs, n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(all_logits(model, seq, embs)[-1].argmax()))
    return seq[len(ids):]


def job(ids, embs, n=6, **kw) -> DynamicJob:
    return DynamicJob(ids, n, gen_settings=GREEDY, embeddings=embs, **kw)


# ---------------------------------------------------------------- placeholder ids


def test_same_content_hash_same_ids_other_content_never_shares():
    a = MMEmbedding(features(0), content_hash=b"image-a")
    a2 = MMEmbedding(features(0), content_hash=b"image-a")
    b = MMEmbedding(features(1), content_hash=b"image-b")
    anon1, anon2 = MMEmbedding(features(0)), MMEmbedding(features(0))
    longer = MMEmbedding(features(0, 50), content_hash=b"image-a")  # another encoding of the same bytes
    assert a.token_ids == a2.token_ids and a.first_id >= FIRST_ID
    ranges = [set(e.token_ids) for e in (a, b, anon1, anon2, longer)]
    for i in range(len(ranges)):
        for j in range(i + 1, len(ranges)):
            assert not ranges[i] & ranges[j]
    assert len(a.token_ids) == 40 and a.token_ids == list(range(a.first_id, a.first_id + 40))


def test_encode_with_embeddings_replaces_aliases(tiny):
    _, tok = tiny
    e = MMEmbedding(features(2, 3), text_alias="<img>")
    ids = encode_with_embeddings(tok, "Look: <img> and say", [e])[0].tolist()
    assert ids == tok.encode("Look: ")[0].tolist() + e.token_ids + tok.encode(" and say")[0].tolist()


def test_bad_embedding_inputs_are_refused(tiny):
    model, _ = tiny
    gen = make_gen(tiny)
    e = MMEmbedding(features(3))
    with pytest.raises(ValueError, match="no embedding of this job covers"):
        DynamicJob(prompt(text_ids(4, 0), e, []), 4)
    narrow = MMEmbedding(torch.zeros(3, 32))  # made for a model of hidden size 32
    with pytest.raises(ValueError, match="hidden size"):
        gen.enqueue(job(torch.tensor([[5] + narrow.token_ids]), [narrow]))
    with pytest.raises(TypeError):
        DynamicJob(torch.tensor([[5]]), 4, embeddings=[torch.zeros(3, 64)])


# ---------------------------------------------------------------- generation


def test_output_matches_full_forward_and_batching_with_text_jobs_changes_nothing(tiny):
    model, _ = tiny
    e1 = MMEmbedding(features(10), content_hash=b"one")
    e2 = MMEmbedding(features(11, 20), content_hash=b"two")
    p1 = prompt(text_ids(7, 1), e1, text_ids(9, 2))
    p2 = torch.tensor([text_ids(5, 3) + e2.token_ids + text_ids(3, 4) + e1.token_ids + text_ids(2, 5)])
    p3 = torch.tensor([text_ids(30, 6)])
    want = [greedy_oracle(model, p1[0].tolist(), [e1], 6), greedy_oracle(model, p2[0].tolist(), [e1, e2], 6),
            greedy_oracle(model, p3[0].tolist(), [], 6)]
    # chunks of 16 cut the images across steps; all three jobs share every step
    alone = [run(make_gen(tiny, max_chunk_size=16), [j])[0][0]
             for j in (job(p1, [e1]), job(p2, [e2, e1]), job(p3, []))]
    together, _ = run(make_gen(tiny, max_chunk_size=16), [job(p1, [e1]), job(p2, [e2, e1]), job(p3, None)])
    assert alone == want and together == want


def test_same_image_shares_prefix_pages_other_image_shares_nothing_after_it(tiny):
    model, _ = tiny
    before = text_ids(12, 7)
    img, same, other = (MMEmbedding(features(20), content_hash=b"cat"), MMEmbedding(features(20), content_hash=b"cat"),
                        MMEmbedding(features(21), content_hash=b"dog"))
    question = text_ids(30, 8)
    gen = make_gen(tiny)
    (first,), (r1,) = run(gen, [job(prompt(before, img, question), [img])])
    (second,), (r2,) = run(gen, [job(prompt(before, same, question), [same])])  # another chat, same picture
    assert r1["cached_tokens"] == 0
    n = len(before) + 40 + len(question)
    assert r2["cached_tokens"] == n - 1 and second == first  # all but the last token (it is fed for logits)
    (third,), (r3,) = run(gen, [job(prompt(before, other, question), [other])])
    assert r3["cached_tokens"] <= len(before)  # nothing at or after the image
    assert third == greedy_oracle(model, prompt(before, other, question)[0].tolist(), [other], 6)
    assert third != first
    check_released(gen.pagetable)


def test_two_jobs_on_one_image_at_once_share_pages_and_equal_each_alone(tiny):
    img = MMEmbedding(features(30), content_hash=b"shared")
    p_a = prompt(text_ids(20, 9), img, text_ids(10, 10))
    p_b = prompt(text_ids(20, 9), img, text_ids(14, 11))  # same picture, another question after it
    alone = [run(make_gen(tiny), [job(p, [img])])[0][0] for p in (p_a, p_b)]
    together, finals = run(make_gen(tiny), [job(p_a, [img]), job(p_b, [img])])
    assert together == alone
    assert finals[1]["cached_tokens"] >= 48  # the leader's pages through the image (20 + 40 tokens)


def test_lora_jobs_with_images_beside_jobs_without(tiny, tiny_llama_folder, tmp_path):
    from tests.engine.test_lora import write_peft_adapter

    adapter = write_peft_adapter(tiny_llama_folder, tmp_path / "ad", r=4, alpha=8)
    img = MMEmbedding(features(40), content_hash=b"lora-pic")
    p = prompt(text_ids(9, 12), img, text_ids(8, 13))

    def gen():
        g = make_gen(tiny, max_chunk_size=32)
        g.load_lora(adapter, "ad")
        return g

    alone = [run(gen(), [job(p, [img], loras=loras)])[0][0] for loras in ([("ad", 1.0)], None)]
    together, finals = run(gen(), [job(p, [img], loras=[("ad", 1.0)]), job(p, [img]),
                                   job(torch.tensor([text_ids(25, 14)]), None, loras=[("ad", 1.0)])])
    assert together[:2] == alone and alone[0] != alone[1]
    assert finals[0]["cached_tokens"] == 0 or finals[1]["cached_tokens"] == 0  # no K/V across adapter sets


def test_speculative_decoding_skips_image_jobs_for_a_draft_model_and_keeps_outputs(tiny, tmp_path):
    model, tok = tiny
    draft = Model.load(write_tiny_model(tmp_path / "draft", arch="llama", seed=0), device="cpu", dtype=torch.float32)
    img = MMEmbedding(features(50), content_hash=b"spec")
    rep = text_ids(6, 15) * 4
    p_img = prompt(rep, img, rep)
    p_txt = torch.tensor([rep * 2])
    want = [greedy_oracle(model, p_img[0].tolist(), [img], 10), greedy_oracle(model, p_txt[0].tolist(), [], 10)]
    g = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=PAGE), tok, draft_model=draft,
                         draft_cache=PagedCache(draft, max_tokens=1024, page_size=PAGE))
    out, finals = run(g, [job(p_img, [img], 10), job(p_txt, None, 10)])
    assert out == want
    assert finals[0]["accepted_draft_tokens"] + finals[0]["rejected_draft_tokens"] == 0
    assert finals[1]["accepted_draft_tokens"] > 0  # the text job was drafted (the draft is the main model)
    g = make_gen(tiny, use_ngram_draft=True)
    out, finals = run(g, [job(p_img, [img], 10), job(p_txt, None, 10)])
    assert out == want


def test_cancel_and_page_pressure_leave_no_leaks(tiny):
    model, _ = tiny
    rng = random.Random(0)
    imgs = [MMEmbedding(features(60 + i, 24), content_hash=bytes([i])) for i in range(3)]
    gen = make_gen(tiny, max_tokens=8 * PAGE, max_chunk_size=16)  # room for ~2 jobs at once
    jobs = []
    for i in range(8):
        e = imgs[i % 3]
        jobs.append(job(prompt(text_ids(rng.randint(1, 20), i), e, text_ids(rng.randint(1, 12), 100 + i)), [e],
                        n=rng.randint(2, 10)))
    gen.enqueue(jobs)
    steps = 0
    while gen.num_remaining_jobs():
        gen.iterate()
        check_table(gen.pagetable, live_sequences(gen))
        steps += 1
        if steps == 3 and gen.active:
            gen.cancel(gen.active[0])
        if steps == 5 and gen.pending:
            gen.cancel(gen.pending[-1])
    check_released(gen.pagetable)


def test_async_jobs_carry_embeddings(tiny):
    import asyncio

    from engine import DynamicGeneratorAsync, DynamicJobAsync

    model, tok = tiny
    img = MMEmbedding(features(70), content_hash=b"async")
    p = prompt(text_ids(5, 20), img, text_ids(6, 21))

    async def main():
        agen = DynamicGeneratorAsync(model=model, cache=PagedCache(model, max_tokens=1024, page_size=PAGE),
                                     tokenizer=tok)
        try:
            j = DynamicJobAsync(agen, input_ids=p, max_new_tokens=6, gen_settings=GREEDY, embeddings=[img])
            return [t for r in [r async for r in j] if r["stage"] == "streaming" for t in r["token_ids"]]
        finally:
            await agen.close()

    assert asyncio.run(asyncio.wait_for(main(), 120)) == greedy_oracle(model, p[0].tolist(), [img], 6)


# ---------------------------------------------------------------- prompt helpers (torch-free)


def test_template_messages_and_marker_expansion():
    shaped, images = split_images([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": [{"type": "text", "text": "See"},
                                                                     {"type": "image", "image": "IMG"}]}])
    assert images == ["IMG"]
    assert shaped == [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                      {"role": "user", "content": [{"type": "text", "text": "See"}, {"type": "image"}]}]
    with pytest.raises(ValueError):
        split_images([{"role": "user", "content": [{"type": "audio"}]}])
    # the Idefics3 processor's strings (transformers' _prompt_split_image / _prompt_single_image)
    f, g = "<fake_token_around_image>", "<global-img>"
    assert IDEFICS3.expand(2, 1, 2) == f"{f}<row_1_col_1><image><image>{f}<row_1_col_2><image><image>\n\n{f}{g}<image><image>{f}"
    assert IDEFICS3.expand(2) == f"{f}{g}<image><image>{f}" and IDEFICS3.tiles(2, 3) == 7 and IDEFICS3.tiles(0, 0) == 1
    assert GEMMA3.expand(3) == "\n\n<start_of_image>" + "<image_soft_token>" * 3 + "<end_of_image>\n\n"
    assert expand_markers("a<image>b<image>", IDEFICS3, ["X", "Y"]) == "aXbY"
    with pytest.raises(ValueError, match="2 image markers"):
        expand_markers("a<image>b<image>", IDEFICS3, ["X"])
    assert fill_image_tokens([1, 9, 9, 2, 9], 9, [[100, 101], [102]]) == [1, 100, 101, 2, 102]
    with pytest.raises(ValueError):
        fill_image_tokens([1, 9], 9, [[100, 101]])
    assert grid([{"rows": 2, "cols": 3}]) == (2, 3) and grid([None]) == (0, 0)
    assert grid([{"row": 1, "col": 1}, {"row": 1, "col": 2}, {"row": 2, "col": 2}, None]) == (2, 2)
