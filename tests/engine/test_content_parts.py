"""Contents as a chat template reads them: a parts-only template (SmolVLM's) is found by its render and gets
each string content as a text part from the tokenizer; string templates and either-way ones are left alone."""
from __future__ import annotations

from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.chat.content_parts import as_parts, takes_content_parts
from engine.model.chat_format import CHATML_TEMPLATE
from tests.tiny_vlms import GEMMA3_TEMPLATE, IDEFICS3_TEMPLATE


def renderer(source: str):
    template = ImmutableSandboxedEnvironment().from_string(source)
    return lambda messages: template.render(messages=messages, add_generation_prompt=True, bos_token="")


def test_only_a_template_that_drops_string_text_takes_parts():
    assert takes_content_parts(renderer(IDEFICS3_TEMPLATE))
    assert not takes_content_parts(renderer(GEMMA3_TEMPLATE))  # it reads a string too
    assert not takes_content_parts(renderer(CHATML_TEMPLATE))


def test_as_parts_turns_strings_into_one_text_part_and_keeps_parts():
    image = [{"type": "image"}]
    messages = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": image},
                {"role": "assistant", "content": None}]
    assert as_parts(messages) == [{"role": "system", "content": [{"type": "text", "text": "Be brief"}]},
                                  {"role": "user", "content": image},
                                  {"role": "assistant", "content": [{"type": "text", "text": ""}]}]
    assert messages[0]["content"] == "Be brief"  # the input is not modified


def test_a_vlm_tokenizer_renders_string_contents_and_an_empty_one(tiny_vlm_folder):
    from engine import Tokenizer

    tok = Tokenizer.load(tiny_vlm_folder)
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi there"},
                                    {"role": "assistant", "content": ""}, {"role": "user", "content": ""}])
    assert text == ("<|im_start|>System: Be brief<end_of_utterance>\nUser: Hi there<end_of_utterance>\n"
                    "Assistant: <end_of_utterance>\nUser: <end_of_utterance>\nAssistant:")
    tok.chat_template = CHATML_TEMPLATE  # another template is probed again: a string template gets strings
    chatml = tok.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert "user\nHi there<|im_end|>" in chatml and "type" not in chatml
