"""Which prompt format a model's chats use: its own chat template, its family's, or plain completion.

The rule, decided here once for the app, the server and the CLI (torch-free, so the app can ask it):

1. The model's own template (a GGUF's `tokenizer.chat_template`, an HF folder's tokenizer_config /
   chat_template.jinja) when it has one.
2. Otherwise the template of the family its vocabulary belongs to, recognised by the special tokens the
   family's chat turns are made of (ChatML `<|im_start|>`, Llama 3 `<|start_header_id|>`, Gemma
   `<start_of_turn>`, Phi-3 `<|user|>`/`<|end|>`, Mistral `[INST]`). Where a vocabulary has the turn
   tokens of several families, the one its architecture belongs to wins. These are the markers llama.cpp's
   template detection looks for in a template's text, applied to the vocabulary instead, as LM Studio and
   Ollama do for a file that carries no template.
3. A vocabulary with no chat tokens at all is a base model: its chats are sent as plain text to continue
   (the messages' text in order, nothing added), and the decision says so.

A harmony model (gpt-oss: its template writes `<|channel|>`/`<|message|>` messages, or, without a
template, its vocabulary has those special tokens) is rendered by pagedeck's harmony renderer
(engine.chat.harmony_render: the reasoning effort in the system message, tools and calls as harmony
writes them) rather than by its Jinja template; "model" still picks the template itself.

The user can override the decision per model (`choice`): "auto" (the rule), "model" (its own template),
a family key, "harmony", "plain", or the path of a Jinja file. Every decision names itself in `label`, so the UI and
the server can say which format a chat uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..chat.harmony import harmony_vocabulary, uses_harmony

AUTO, OWN, PLAIN, HARMONY = "auto", "model", "plain", "harmony"

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Meta-Llama-3-8B-Instruct's own template.
LLAMA3_TEMPLATE = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Gemma 3's turns: a system prompt opens the first user turn (Gemma has no system role).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set messages = messages[1:] %}"
    "{% else %}{% set first = '' %}{% endif %}"
    "{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# Phi-3.5-mini-instruct's own template.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
# Mistral v0.3's turns (its [INST] markers are control tokens): the system prompt goes into the last user turn.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{% if loop.last and system %}{{ '[INST] ' + system + '\n\n' + message['content'] + '[/INST]' }}"
    "{% else %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% endif %}"
    "{% else %}{{ ' ' + message['content'] | trim + eos_token }}{% endif %}{% endfor %}"
)
# Plain completion: the messages' text in order, a blank line between turns; a reply continues the text
# before it directly (it was generated as its continuation).
PLAIN_TEMPLATE = (
    "{% for message in messages %}{% if not loop.first and message['role'] != 'assistant' %}{{ '\n\n' }}{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)


@dataclass(frozen=True)
class Family:
    title: str
    tokens: tuple[str, ...]  # the special tokens its turns are made of (all present: the vocabulary is this family's)
    template: str


# Checked in this order (a vocabulary with several families' tokens: its architecture's family first).
FAMILIES: dict[str, Family] = {
    "chatml": Family("ChatML", ("<|im_start|>", "<|im_end|>"), CHATML_TEMPLATE),
    "llama3": Family("Llama 3", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), LLAMA3_TEMPLATE),
    "gemma": Family("Gemma", ("<start_of_turn>", "<end_of_turn>"), GEMMA_TEMPLATE),
    "phi3": Family("Phi-3", ("<|user|>", "<|assistant|>", "<|end|>"), PHI3_TEMPLATE),
    "mistral": Family("Mistral", ("[INST]", "[/INST]"), MISTRAL_TEMPLATE),
}
ARCH_FAMILIES = {"llama": "llama3", "mistral": "mistral", "qwen2": "chatml", "qwen3": "chatml", "gemma": "gemma",
                 "gemma2": "gemma", "gemma3": "gemma", "gemma3_text": "gemma", "phi3": "phi3"}


@dataclass(frozen=True)
class ChatFormat:
    """One decision: the Jinja template a model's chats are rendered with, and how to say which it is."""
    choice: str  # what was asked: AUTO, OWN, a family key, HARMONY, PLAIN or a template file's path
    kind: str  # "model" (its own template), "fallback" (a family's), "harmony" (pagedeck's renderer), "plain"
    # or "custom" (a file)
    template: str
    label: str  # one line: "model's own template", "fallback: Llama 3 (no template in file)", ...
    short: str  # a few words for a chat's status line
    family: str | None = None  # the family key of a fallback (or the family its own template looks like)

    @property
    def plain(self) -> bool:
        return self.kind == "plain"

    @property
    def harmony(self) -> bool:
        """Chats are rendered by engine.chat.harmony_render (`template` is the model's own, unused)."""
        return self.kind == HARMONY


def family_of_vocabulary(has_token: Callable[[str], bool], arch: str | None = None) -> str | None:
    """The family whose turn tokens are all in the vocabulary (its architecture's family first), or None."""
    found = [key for key, fam in FAMILIES.items() if all(has_token(t) for t in fam.tokens)]
    preferred = ARCH_FAMILIES.get(arch or "")
    if preferred in found:
        return preferred
    return found[0] if found else None


def family_of_template(template: str) -> str | None:
    """The family a template's text writes turns for (the markers llama.cpp's detection looks for), or None."""
    for key, fam in FAMILIES.items():
        if fam.tokens[0] in template:
            return key
    return None


def chat_format_choices() -> list[tuple[str, str]]:
    """(choice, label) of every override a user can pick besides a custom file, the rule first."""
    return ([(AUTO, "automatic (the model's own, else its family's)"), (OWN, "the model's own template")]
            + [(key, f"{fam.title}") for key, fam in FAMILIES.items()]
            + [(HARMONY, "harmony (gpt-oss)"), (PLAIN, "plain completion (no chat format)")])


def check_chat_format(choice: str) -> str:
    """`choice` if it names a format or an existing template file, else ValueError naming the options."""
    if choice in (AUTO, OWN, PLAIN, HARMONY) or choice in FAMILIES:
        return choice
    path = Path(choice).expanduser()
    if path.suffix in (".jinja", ".j2", ".txt", ".tmpl") or path.exists():
        if not path.is_file():
            raise ValueError(f"chat template file not found: {path}")
        return str(path)
    names = ", ".join([AUTO, OWN, *FAMILIES, HARMONY, PLAIN])
    raise ValueError(f"unknown chat template {choice!r}: use one of {names}, or the path of a Jinja file")


def decide(own_template: str | None, has_token: Callable[[str], bool], arch: str | None = None,
           choice: str = AUTO, add_bos: bool = False) -> ChatFormat:
    """The format a model's chats use (see the module docstring). add_bos: the vocabulary wants BOS first,
    which plain completion then writes itself (the families' templates write it as their models do)."""
    choice = check_chat_format(choice)
    plain_template = ("{{ bos_token }}" if add_bos else "") + PLAIN_TEMPLATE
    if choice in FAMILIES:
        fam = FAMILIES[choice]
        return ChatFormat(choice, "fallback", fam.template, f"{fam.title} (chosen for this model)",
                          f"{fam.title} (chosen)", choice)
    if choice == PLAIN:
        return ChatFormat(choice, "plain", plain_template, "plain completion (chosen for this model)",
                          "plain completion", None)
    if choice == HARMONY:
        return ChatFormat(choice, HARMONY, own_template or "", "harmony (gpt-oss), chosen for this model",
                          "harmony (chosen)", HARMONY)
    if choice == AUTO and (uses_harmony(own_template) if own_template else harmony_vocabulary(has_token)):
        why = "its template writes harmony" if own_template else "harmony tokens in its vocabulary, no template"
        return ChatFormat(choice, HARMONY, own_template or "", f"harmony (gpt-oss): {why}", "harmony", HARMONY)
    if choice not in (AUTO, OWN):
        path = Path(choice)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read chat template file {path}: {e}") from None
        return ChatFormat(choice, "custom", text, f"custom template: {path.name}", f"custom: {path.name}",
                          family_of_template(text))
    if own_template:
        return ChatFormat(choice, "model", own_template, "model's own template", "model's template",
                          family_of_template(own_template))
    key = family_of_vocabulary(has_token, arch)
    if key is None:
        return ChatFormat(choice, "plain", plain_template,
                          "plain completion (base model: no chat template and no chat tokens)",
                          "plain completion (base model)", None)
    fam = FAMILIES[key]
    return ChatFormat(choice, "fallback", fam.template, f"fallback: {fam.title} (no template in file)",
                      f"{fam.title} (fallback)", key)
