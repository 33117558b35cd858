"""engine.Model against Hugging Face transformers in fp32: logits and greedy continuations.

Tiny random models of every architecture are written to disk by transformers itself; the default
model is compared with transformers' own GGUF loader.
"""

import pytest
import torch

from engine.model.model import Model
from tools.logits import forward_tokens
from tests.tiny_models import ARCHS, default_tokenizer, hf_default_model, write_tiny_gguf, write_tiny_model

GREEDY_TOKENS = 32
TINY_ATOL = 1e-4  # logits have std ~2 on the tiny models


def hf_model(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def prompt_ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 49152, (1, n), generator=torch.Generator().manual_seed(seed))


def assert_same_greedy(ours_logits: torch.Tensor, prompt_len: int, continuation: list[int]) -> None:
    """Greedy decoding is identical iff, fed the peer's greedy tokens, our argmax picks each of them."""
    picks = ours_logits[prompt_len - 1: prompt_len - 1 + len(continuation)].argmax(-1).tolist()
    first_diff = next((i for i, (a, b) in enumerate(zip(picks, continuation)) if a != b), None)
    assert first_diff is None, f"greedy diverges at new token {first_diff}: ours {picks} vs peer {continuation}"


@torch.inference_mode()
def greedy_hf(model, ids: torch.Tensor, steps: int) -> list[int]:
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


@torch.inference_mode()
def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits[0].float()


# ---------------------------------------------------------------- tiny models, every architecture

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_tiny_model_logits_and_greedy_match_transformers(tmp_path, arch, tie):
    folder = write_tiny_model(tmp_path / arch, arch, tie=tie, seed=2 * ARCHS.index(arch) + tie)
    ours, theirs = Model.load(folder, device="cpu", dtype=torch.float32), hf_model(folder)
    # LongRoPE: stay within the short-factor range (64), where transformers' generate uses one rope
    ids = prompt_ids(24 if arch == "phi3-long" else 40, seed=1)
    continuation = greedy_hf(theirs, ids, GREEDY_TOKENS)
    assert len(set(continuation)) > 3  # a real continuation, not one repeated token
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    a, b = forward_tokens(ours, full), hf_logits(theirs, full)
    assert a.dtype == torch.float32 and a.shape == (full.shape[1], 49152)
    assert (a - b).abs().max().item() < TINY_ATOL, f"{arch} tie={tie}: max abs diff {(a - b).abs().max().item()}"
    assert_same_greedy(a, ids.shape[1], continuation)


def test_tiny_llama3_rope_scaling_matters(tmp_path):
    """The peer test can fail: dropping Llama-3 rope scaling changes the logits far beyond tolerance."""
    folder = write_tiny_model(tmp_path / "l3", "llama3")
    ours, theirs = Model.load(folder, device="cpu", dtype=torch.float32), hf_model(folder)
    ids = prompt_ids(80, seed=2)  # longer than original_max_position_embeddings (64)
    expected = hf_logits(theirs, ids)
    assert (forward_tokens(ours, ids) - expected).abs().max().item() < TINY_ATOL
    ours.config.rope_scaling = None  # forward_tokens builds its rotation from the config
    assert (forward_tokens(ours, ids) - expected).abs().max().item() > 100 * TINY_ATOL


def test_tiny_model_extra_shapes_match_transformers(tmp_path):
    """qwen3 with head_dim != hidden / heads, and an MHA llama (kv heads = heads)."""
    for arch, extra in (("qwen3", {"head_dim": 32}), ("llama", {"num_key_value_heads": 4})):
        folder = write_tiny_model(tmp_path / arch, arch, **extra)
        ids = prompt_ids(24, seed=3)
        a = forward_tokens(Model.load(folder, device="cpu", dtype=torch.float32), ids)
        assert (a - hf_logits(hf_model(folder), ids)).abs().max().item() < TINY_ATOL, arch


# Mistral is left out: llama.cpp writes it as a "llama" GGUF without its sliding window (as llama.cpp runs it).
GGUF_ARCHS = [a for a in ARCHS if a != "mistral"]


@pytest.mark.parametrize("arch", GGUF_ARCHS)
def test_tiny_gguf_model_matches_transformers_on_the_source_folder(tmp_path, arch):
    """A llama.cpp-layout GGUF (its tensor names; q/k rows permuted for llama; llama3 as a rope_freqs
    tensor; Gemma's norms as 1 + w and no query_pre_attn_scalar key; Phi-3's fused qkv and gate|up and
    LongRoPE factor tensors) gives HF's logits and greedy tokens. 70 tokens: past the sliding windows and
    past LongRoPE's original length (64), where one pass of transformers uses the long factors too."""
    tie = GGUF_ARCHS.index(arch) % 2 == 0 or arch in ("gemma", "gemma2")  # llama.cpp drops their lm_head
    folder = write_tiny_model(tmp_path / arch, arch, tie=tie, seed=GGUF_ARCHS.index(arch))
    path = write_tiny_gguf(folder, tmp_path / f"{arch}.gguf", "F32", tokenizer=False)
    ours, theirs = Model.load(path, device="cpu", dtype=torch.float32), hf_model(folder)
    assert ours.config.tie_word_embeddings == tie
    ids = prompt_ids(70, seed=4)
    a, b = forward_tokens(ours, ids), hf_logits(theirs, ids)
    assert (a - b).abs().max().item() < TINY_ATOL, (a - b).abs().max().item()
    short = prompt_ids(24, seed=5)  # greedy within LongRoPE's short range, as in the folder test
    continuation = greedy_hf(theirs, short, GREEDY_TOKENS)
    assert_same_greedy(forward_tokens(ours, torch.cat([short, torch.tensor([continuation])], dim=1)), 24,
                       continuation)


# ---------------------------------------------------------------- the default model

@pytest.fixture(scope="module")
def default_model():
    return Model.load(None, device="cpu", dtype=torch.float32)


def chat_ids(text: str) -> torch.Tensor:
    tok = default_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return tok.encode(prompt, encode_special_tokens=True)


@pytest.mark.slow
def test_default_model_logits_and_greedy_match_transformers(default_model):
    theirs = hf_default_model()
    ids = chat_ids("Write a short poem about the sea.")
    continuation = greedy_hf(theirs, ids, GREEDY_TOKENS)
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    a, b = forward_tokens(default_model, full), hf_logits(theirs, full)
    assert a.shape == (full.shape[1], 49152)
    assert (a - b).abs().max().item() < 2e-3, (a - b).abs().max().item()  # logits span ~+-30
    assert_same_greedy(a, ids.shape[1], continuation)


def greedy_chat(model, question: str, max_new_tokens: int) -> tuple[str, str]:
    """(prompt, greedy answer) of the default tokenizer's chat template through the paged generator."""
    from engine.cache.paged_cache import PagedCache
    from engine.generator.generator import DynamicGenerator
    from engine.contract import SamplerSettings

    tok = default_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": question}])
    generator = DynamicGenerator(model, PagedCache(model, max_tokens=512, page_size=256), tok)
    answer = generator.generate(prompt, max_new_tokens=max_new_tokens, gen_settings=SamplerSettings.greedy(),
                                encode_special_tokens=True, stop_conditions=sorted(tok.stop_token_ids),
                                completion_only=True)
    return prompt, answer


@pytest.mark.slow
def test_default_model_greedy_chat_answers_paris(default_model):
    tok = default_tokenizer()
    prompt, answer = greedy_chat(default_model, "What is the capital of France?", 24)
    assert "Paris" in answer, answer
    # the same tokens as transformers' greedy decoding of that prompt
    expected = tok.decode(greedy_hf(hf_default_model(), tok.encode(prompt, encode_special_tokens=True), 24))
    assert expected.startswith(answer) and len(answer) > len("Paris"), (answer, expected)
