"""The prompt-format rule on real GGUF files without a chat template: each family's vocabulary gets its
family's format (rendered text checked against the family's real templates, or its documented literal
format), a base vocabulary gets plain completion, an own template always wins, and overrides (a family,
plain, a custom file) apply, with a clear error for an unknown one. The same rule serves `python -m engine
serve` (checked over HTTP with the openai client) and `generate --chat`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import pytest

from engine.model.tokenizer import Tokenizer
from tools.processes import free_port, stop, wait_healthy
from tools.models.synthetic_gguf import copy_default_tokenizer, write_random_gguf

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "data" / "chat_templates"
# Each family's chat-turn special tokens, BOS, EOS and architecture, as its real files have them.
FAMILY_VOCAB = {
    "chatml": (("<|im_start|>", "<|im_end|>"), None, None, "qwen2"),
    "llama3": (("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|begin_of_text|>", "<|end_of_text|>",
               "llama"),
    "gemma": (("<start_of_turn>", "<end_of_turn>"), "<bos>", "<eos>", "gemma3"),
    "phi3": (("<|user|>", "<|assistant|>", "<|end|>", "<|system|>"), "<s>", "<|endoftext|>", "phi3"),
    "mistral": (("[INST]", "[/INST]"), "<s>", "</s>", "llama"),
}
SYSTEM = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Hi!"}]
TURNS = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, how can I help?"},
         {"role": "user", "content": "Tell me a joke."}]


def vocab_only_gguf(path: Path, arch: str, chat_tokens=None, bos=None, eos=None, template: str | bool = False) -> Path:
    """A GGUF holding only a tokenizer (what the rule reads), as a template-less conversion writes it."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    copy_default_tokenizer(w, chat_template=template, chat_tokens=chat_tokens, bos=bos, eos=eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def family_tokenizer(tmp_path: Path, family: str) -> Tokenizer:
    tokens, bos, eos, arch = FAMILY_VOCAB[family]
    return Tokenizer.load(vocab_only_gguf(tmp_path / f"{family}.gguf", arch, tokens, bos, eos))


def render_with(tok: Tokenizer, template: str, messages) -> str:
    """The same vocabulary rendering `template` (the family's real one) as its own."""
    real = Tokenizer(tok._tok, bos_token=tok.bos_token, eos_token=tok.eos_token, chat_template=template)
    return real.apply_chat_template(messages)


@pytest.mark.parametrize("family", sorted(FAMILY_VOCAB))
def test_a_vocabulary_without_template_gets_its_familys_format(tmp_path, family):
    tok = family_tokenizer(tmp_path, family)
    fmt = tok.chat_format
    assert (fmt.kind, fmt.family) == ("fallback", family)
    assert "no template in file" in fmt.label and fmt.label.startswith("fallback: ")
    # the turn markers are the family's special tokens, each one token in the encoded prompt
    ids = tok.encode(tok.apply_chat_template(TURNS), encode_special_tokens=True)[0].tolist()
    first_marker = FAMILY_VOCAB[family][0][0]
    assert tok.token_to_id(first_marker) in ids


def test_fallbacks_render_as_the_families_real_templates(tmp_path):
    gemma = family_tokenizer(tmp_path, "gemma")
    assert gemma.apply_chat_template(TURNS) == render_with(
        gemma, (TEMPLATES / "google-gemma-2-2b-it.jinja").read_text(), TURNS)
    assert gemma.apply_chat_template(SYSTEM) == render_with(
        gemma, (TEMPLATES / "google-gemma-3-4b-it.jinja").read_text(), SYSTEM)
    phi3 = family_tokenizer(tmp_path, "phi3")
    for messages in (SYSTEM, TURNS):
        assert phi3.apply_chat_template(messages) == render_with(
            phi3, (TEMPLATES / "microsoft-Phi-3.5-mini-instruct.jinja").read_text(), messages)
    chatml = family_tokenizer(tmp_path, "chatml")
    qwen = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    assert chatml.apply_chat_template(SYSTEM) == render_with(chatml, qwen, SYSTEM)


def test_llama3_and_mistral_fallbacks_write_their_documented_turns(tmp_path):
    llama3 = family_tokenizer(tmp_path, "llama3")
    assert llama3.apply_chat_template(SYSTEM) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou answer briefly.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    mistral = family_tokenizer(tmp_path, "mistral")
    assert mistral.apply_chat_template(TURNS) == (
        "<s>[INST] Hello[/INST] Hi, how can I help?</s>[INST] Tell me a joke.[/INST]")
    assert mistral.apply_chat_template(SYSTEM) == "<s>[INST] You answer briefly.\n\nHi![/INST]"


def test_a_base_vocabulary_gets_plain_completion(tmp_path):
    tok = Tokenizer.load(vocab_only_gguf(tmp_path / "base.gguf", "llama", chat_tokens=()))
    fmt = tok.chat_format
    assert fmt.plain and fmt.label == "plain completion (base model: no chat template and no chat tokens)"
    text = tok.apply_chat_template([{"role": "user", "content": "Once upon a time"},
                                    {"role": "assistant", "content": " there was"},
                                    {"role": "user", "content": "Go on."}])
    assert text == "Once upon a time there was\n\nGo on."
    assert not any(t in text for t in ("<|im_start|>", "user", "assistant"))


def test_the_models_own_template_wins_and_the_architecture_breaks_ties(tmp_path):
    own = Tokenizer.load(vocab_only_gguf(tmp_path / "own.gguf", "llama", ("<start_of_turn>", "<end_of_turn>"),
                                         template=True))
    assert own.chat_format.kind == "model" and own.chat_format.label == "model's own template"
    assert own.apply_chat_template(TURNS).startswith("<|im_start|>")  # SmolLM2's own, not Gemma's
    # a vocabulary with both ChatML's and Gemma's turn tokens: its architecture decides
    both = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>")
    for arch, family in (("gemma2", "gemma"), ("qwen2", "chatml"), ("llama", "chatml")):
        tok = Tokenizer.load(vocab_only_gguf(tmp_path / f"{arch}.gguf", arch, both))
        assert tok.chat_format.family == family, arch


def test_overrides_a_family_plain_and_a_custom_file(tmp_path):
    tok = family_tokenizer(tmp_path, "llama3")
    assert tok.set_chat_format("gemma").label == "Gemma (chosen for this model)"
    assert tok.apply_chat_template(TURNS).startswith("<|begin_of_text|><start_of_turn>user\nHello")
    assert tok.set_chat_format("plain").plain
    assert tok.apply_chat_template(TURNS) == "HelloHi, how can I help?\n\nTell me a joke."  # replies continue their text
    custom = tmp_path / "mine.jinja"
    custom.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>")
    fmt = tok.set_chat_format(str(custom))
    assert (fmt.kind, fmt.label) == ("custom", "custom template: mine.jinja")
    assert tok.apply_chat_template(SYSTEM) == "[system] You answer briefly.\n[user] Hi!\n>"
    with pytest.raises(ValueError, match="unknown chat template 'vicuna'"):
        tok.set_chat_format("vicuna")
    with pytest.raises(ValueError, match="chat template file not found"):
        tok.set_chat_format(str(tmp_path / "gone.jinja"))
    assert tok.chat_format.kind == "custom"  # a refused override keeps the format in use
    assert tok.set_chat_format("auto").label == "fallback: Llama 3 (no template in file)"


def test_an_hf_folder_without_template_follows_the_rule(tmp_path):
    import json

    base = Tokenizer.load()
    Tokenizer(base._tok, bos_token="<|im_start|>", eos_token="<|im_end|>").save(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tok = Tokenizer.load(tmp_path / "m")
    assert tok.arch == "qwen2" and tok.chat_format.label == "fallback: ChatML (no template in file)"


def test_generate_chat_says_its_format_and_honours_the_override(tmp_path):
    model = write_random_gguf(tmp_path / "base.gguf", "tiny", 1, "Q8_0", chat_template=False, chat_tokens=())
    run = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(model), "--chat", "Hi",
                          "--max-new-tokens", "2", "--weights", "dense", "--greedy", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "prompt format: plain completion (base model" in run.stderr
    bad = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(model), "--chat", "Hi",
                          "--chat-template", "nosuch"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: unknown chat template 'nosuch': use one of auto, model, chatml, llama3, gemma, phi3, mistral, harmony, plain, "
        "or the path of a Jinja file"]


@pytest.mark.timeout(600)
def test_the_server_applies_the_same_rule(tmp_path):
    tokens, bos, eos, _arch = FAMILY_VOCAB["llama3"]
    model = write_random_gguf(tmp_path / "llama3-notemplate.gguf", "tiny", 1, "Q8_0", chat_template=False,
                              chat_tokens=tokens, bos=bos, eos=eos)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(model), "--port", str(port),
                             "--weights", "dense", "--threads", "1", "--cache-tokens", "1024"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        [entry] = client.models.list().data
        assert entry.model_extra["prompt_format"] == "fallback: Llama 3 (no template in file)"
        reply = client.chat.completions.create(model=entry.id, messages=SYSTEM, max_tokens=1, temperature=0)
    finally:
        stop(proc)
    tok = Tokenizer.load(model)
    expected = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou answer briefly.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert reply.usage.prompt_tokens == tok.encode(expected, encode_special_tokens=True).shape[1]
    assert "prompt format: fallback: Llama 3 (no template in file)" in proc.stdout.read()
