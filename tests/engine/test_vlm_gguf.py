"""The pair LM Studio downloads for a vision-language model, end to end: a llama.cpp-style language-model GGUF
(tools.models.vlm_gguf) and its mmproj GGUF (tools.models.mmproj_gguf) written from a tiny random SmolVLM / Gemma 3 folder,
found the way the app finds them (LM Studio's models/<publisher>/<model>/ layout, Ollama's blobs through
their manifest), loaded through the public path the app and `engine serve` take (Model.load, Tokenizer.load,
engine.load_vision of the model's path), give the HF folder's prompt ids, image embeddings and logits.

Tolerances: the F32 files hold the folder's float32 weights (Llama's q/k rows permuted, a reordering the
loader undoes; Gemma's norms as 1 + w, one float32 rounding at most), and the GGUF vocabulary is the
folder's token for token, so the GGUF side is compared with the folder side at 1e-5 (observed: identical)
and with the full transformers model at test_vlm_text's bound (2e-4 absolute + 1e-4 relative: summation
order only, while a wrong token or a missing image run moves logits by O(1)).
"""
from __future__ import annotations

import shutil

import gguf
import pytest
import torch

from engine import Model, Tokenizer, image_prompt, load_vision
from engine.generator.embeddings import FIRST_ID
from engine.model.catalog.discovery import find_mmproj as listed_mmproj
from engine.model.catalog.discovery import find_models
from engine.vision import find_mmproj
from tests.engine.test_vlm_text import ATOL, RTOL, all_logits, chat, image
from tests.tiny_vlms import write_gguf_pair, write_ollama_store, write_tiny_vlm_folder

EXACT = 1e-5
IMAGE_TOKENS = {"idefics3": ["<image>", "<fake_token_around_image>", "<global-img>", "<row_1_col_1>", "<row_2_col_2>"],
                "gemma3": ["<start_of_image>", "<image_soft_token>", "<end_of_image>"]}


@pytest.fixture(scope="module", params=["idefics3", "gemma3"])
def pair(request, tmp_path_factory):
    kind = request.param
    root = tmp_path_factory.mktemp(f"pair-{kind}")
    hf = write_tiny_vlm_folder(root / "hf" / f"tiny-{kind}", kind)
    home = root / "home"
    model, mmproj = write_gguf_pair(hf, home / ".lmstudio" / "models" / "pagedeck-test" / f"Tiny-{kind}-GGUF",
                                    f"Tiny-{kind}-F32")
    return kind, hf, home, model, mmproj


def test_the_text_gguf_is_written_as_llama_cpp_writes_it(pair):
    kind, hf, _, model, _ = pair
    reader = gguf.GGUFReader(str(model))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == ("llama" if kind == "idefics3" else "gemma3")
    assert (field("tokenizer.ggml.model"), field("tokenizer.ggml.pre")) == ("gpt2", "smollm")
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    hf_tok = Tokenizer.load(hf)
    assert len(tokens) == hf_tok.vocab_size and all(tokens[hf_tok.token_to_id(t)] == t for t in IMAGE_TOKENS[kind])
    assert {types[tokens.index(t)] for t in IMAGE_TOKENS[kind]} == {gguf.TokenType.CONTROL}
    assert types[tokens.index("Ġthe")] == gguf.TokenType.NORMAL
    assert "<start_of_image>" in field("tokenizer.chat_template") or "<image>" in field("tokenizer.chat_template")
    names = {t.name for t in reader.tensors}
    assert "blk.0.attn_q.weight" in names and not any(n.startswith(("v.", "mm.")) for n in names)


def test_discovery_lists_the_pair_and_the_loader_finds_its_projector(pair):
    kind, _, home, model, mmproj = pair
    found = find_models(env={}, home=home)
    assert [f.path for f in found] == [model]  # the projector is no model of its own
    assert found[0].mmproj == mmproj and found[0].sees_images
    assert find_mmproj(model) == mmproj
    vision = load_vision(found[0].path)
    assert vision is not None and vision.kind == kind


def _run(path, img):
    """Prompt ids, image embeddings and every position's logits of the image chat, loaded from `path` the
    way the app and the server load a model."""
    model, tok = Model.load(path, device="cpu", dtype=torch.float32), Tokenizer.load(path)
    ids, embs = image_prompt(chat(img), tok, load_vision(path), cache=None)
    ids = ids[0].tolist()
    return ids, torch.cat([e.embeddings for e in embs]), all_logits(model, ids, embs)


def _transformers_logits(hf_folder, kind: str, ids: list[int], img) -> torch.Tensor:
    """The full transformers model on the same prompt, its own image processor reading the image."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(hf_folder, dtype=torch.float32).eval()
    image_id = hf.config.image_token_id
    hf_ids = torch.tensor([[image_id if t >= FIRST_ID else t for t in ids]])
    processor = AutoImageProcessor.from_pretrained(hf_folder)
    with torch.no_grad():
        if kind == "idefics3":
            px = processor(images=[[img]], return_tensors="pt")
            return hf(input_ids=hf_ids, pixel_values=px["pixel_values"],
                      pixel_attention_mask=px["pixel_attention_mask"]).logits[0]
        pv = processor(images=[img], return_tensors="pt")["pixel_values"]
        return hf(input_ids=hf_ids, pixel_values=pv, token_type_ids=(hf_ids == image_id).long()).logits[0]


def test_the_gguf_pair_gives_the_hf_folders_embeddings_and_logits(pair):
    kind, hf, _, model, _ = pair
    img = image(11)  # 100 x 90: SmolVLM scales it to 256 x 230, 4 x 4 tiles of 64 px + the global view
    ids, emb, logits = _run(model, img)
    ref_ids, ref_emb, ref_logits = _run(hf, img)
    assert [t for t in ids if t < FIRST_ID] == [t for t in ref_ids if t < FIRST_ID]
    assert [t >= FIRST_ID for t in ids] == [t >= FIRST_ID for t in ref_ids]
    assert emb.shape[0] == (17 * 16 if kind == "idefics3" else 16)
    torch.testing.assert_close(emb, ref_emb, atol=EXACT, rtol=0)
    torch.testing.assert_close(logits, ref_logits, atol=EXACT, rtol=0)
    torch.testing.assert_close(logits, _transformers_logits(hf, kind, ids, img), atol=ATOL, rtol=RTOL)


def test_of_several_projectors_the_loader_takes_the_one_the_list_shows(pair, tmp_path):
    _, _, _, model, mmproj = pair
    folder = tmp_path / "publisher" / "two-projectors"
    folder.mkdir(parents=True)
    mine = folder / model.name
    shutil.copyfile(model, mine)
    shutil.copyfile(mmproj, folder / "mmproj-Another-Model-f16.gguf")  # first by name, not this model's
    shutil.copyfile(mmproj, folder / f"mmproj-{model.name}")
    assert find_mmproj(mine) == listed_mmproj(mine) == folder / f"mmproj-{model.name}"


def test_an_ollama_model_with_a_projector_layer_sees_images(pair, tmp_path):
    kind, hf, _, model, mmproj = pair
    store = tmp_path / "ollama"
    blob = write_ollama_store(store, model, mmproj, f"tiny-{kind}")
    (found,) = find_models(env={"OLLAMA_MODELS": str(store)}, home=tmp_path / "nohome")
    assert found.path == blob and found.mmproj is not None and found.mmproj.name.startswith("sha256-")
    assert find_mmproj(blob) == found.mmproj
    img = image(12)
    ids, emb, logits = _run(blob, img)
    ref_ids, ref_emb, ref_logits = _run(hf, img)
    assert [t for t in ids if t < FIRST_ID] == [t for t in ref_ids if t < FIRST_ID]
    torch.testing.assert_close(emb, ref_emb, atol=EXACT, rtol=0)
    torch.testing.assert_close(logits, ref_logits, atol=EXACT, rtol=0)
    assert load_vision(found.mmproj).kind == kind  # the projector blob named directly


def test_engine_serve_on_the_gguf_pair_answers_an_image_url_as_the_hf_folder(pair):
    """A real `python -m engine serve --model <the text GGUF>` loads the mmproj beside it and answers an
    OpenAI image_url request with the HF folder's own greedy reply."""
    from engine.vision.image_input import data_url, decode_image
    from tests.engine.test_server_images import engine_answer, picture, png_of, served_process

    kind, hf, _, model, _ = pair
    png = png_of(picture(21, (90, 60)))
    with served_process(model) as served:
        client = served.client()
        name = client.models.list().data[0].id
        out = client.chat.completions.create(model=name, max_tokens=6, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                         {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}}]}])
    mine = engine_answer(hf, [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                                           {"type": "image", "image": decode_image(png)}]}], 6)
    assert out.choices[0].message.content == mine and mine
    per_image = 13 * 16 if kind == "idefics3" else 16  # 90 x 60 -> 256 x 171: 4 x 3 tiles + global; Gemma: 16
    assert out.usage.prompt_tokens > per_image


def test_llama_cpp_reads_the_text_gguf_as_pagedeck_does(pair, tmp_path):
    """llama.cpp itself (tests.oracles.llamacpp_peer, in a process of its own) loads the text GGUF, tokenizes the
    image chat's expanded prompt (tile tags and image tokens as control tokens) into pagedeck's ids, and
    gives its logits on them (the image tokens' own embeddings: text only) within test_fidelity_llamacpp's
    F32 bounds (KL mean 1e-4, 1e-3 at a position: llama.cpp keeps its K/V cache in F16)."""
    import numpy as np

    from tests.llamacpp_fidelity import kl
    from tests.oracles.llamacpp_peer import run_jobs

    kind, hf, _, model, _ = pair
    tok = Tokenizer.load(model)
    ids, _ = image_prompt(chat(image(13)), tok, load_vision(model), cache=None)
    image_id = tok.token_to_id("<image>" if kind == "idefics3" else "<image_soft_token>")
    ids = [image_id if t >= FIRST_ID else t for t in ids[0].tolist()]
    text = tok.decode(ids, decode_special_tokens=True)
    out = tmp_path / "logits.npy"
    tokenized, logits = run_jobs([{"op": "tokenize", "model": str(model), "texts": [text], "special": True},
                                  {"op": "logits", "model": str(model), "ids": ids, "out": str(out)}], tmp_path)
    assert tokenized["ok"] and logits["ok"], (tokenized, logits)
    assert tokenized["ids"] == [ids]
    ours = all_logits(Model.load(model, device="cpu", dtype=torch.float32), ids, [])
    theirs = torch.from_numpy(np.load(out))[:, : ours.shape[1]]
    divergence = kl(theirs, ours)
    assert divergence.mean() < 1e-4 and divergence.max() < 1e-3, (divergence.mean(), divergence.max())


def test_an_f16_pair_stays_within_its_rounding(pair, tmp_path):
    """The usual download: F16 weights in both files. F16 keeps 11 significant bits (relative 2^-11 per
    weight); through these layers the logits moved by 0.28% (SmolVLM) and 0.15% (Gemma 3) of their largest
    magnitude, measured; bound 1.5% of it, while a misread tensor moves logits by their own size."""
    kind, hf, _, _, _ = pair
    model, _ = write_gguf_pair(hf, tmp_path / "f16", f"Tiny-{kind}-F16", "f16")
    img = image(14)
    ids, _, logits = _run(model, img)
    ref_ids, _, ref_logits = _run(hf, img)
    assert [t for t in ids if t < FIRST_ID] == [t for t in ref_ids if t < FIRST_ID]
    scale = float(ref_logits.abs().max())
    torch.testing.assert_close(logits, ref_logits, atol=0.015 * scale, rtol=0)
    assert not torch.equal(logits, ref_logits)
