"""engine.chat reasoning: think blocks split from the answer, whole and streamed split anywhere, with the
markers read off the real templates."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from engine.chat import (
    MISTRAL_THINK, THINK, ReasoningParser, reasoning_markers, split_reasoning, starts_in_reasoning,
    supports_thinking_switch,
)

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"

# (markers, starts inside reasoning, reply, reasoning, content)
CASES = [
    (THINK, False, "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.", "The user wants 2+2.", "It is 4."),
    (THINK, True, "Opened by the prompt.\n</think>\n\nAnswer", "Opened by the prompt.", "Answer"),
    (THINK, False, "  Just an answer, <think> is a tag.", "", "  Just an answer, <think> is a tag."),
    (THINK, False, "<think>\nstill thinking when cut off <", "still thinking when cut off <", ""),
    (THINK, False, "<think></think>Empty thought", "", "Empty thought"),
    (THINK, False, "<thin", "", "<thin"),
    (THINK, False, "<think>a </thinking> b</think> c", "a </thinking> b", "c"),
    (MISTRAL_THINK, False, "[THINK]Plan.[/THINK]Done.", "Plan.", "Done."),
    (None, False, "<think>x</think> y", "", "<think>x</think> y"),
    (THINK, False, "", "", ""),
]


def _stream(markers, in_reasoning, pieces):
    parser = ReasoningParser(markers, in_reasoning=in_reasoning)
    r, c = [], []
    for piece in pieces:
        dr, dc = parser.feed(piece)
        r.append(dr)
        c.append(dc)
    dr, dc = parser.finish()
    return "".join(r) + dr, "".join(c) + dc


@pytest.mark.parametrize("markers,in_reasoning,reply,reasoning,content", CASES)
def test_split_whole_and_at_every_boundary(markers, in_reasoning, reply, reasoning, content):
    assert split_reasoning(reply, markers, in_reasoning=in_reasoning) == (reasoning, content)
    for i in range(len(reply) + 1):
        assert _stream(markers, in_reasoning, [reply[:i], reply[i:]]) == (reasoning, content), i


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=10))
def test_streamed_deltas_concatenate_to_the_split(case, cuts):
    markers, in_reasoning, reply, reasoning, content = case
    points = sorted({min(c, len(reply)) for c in cuts})
    pieces = [reply[a:b] for a, b in zip([0, *points], [*points, len(reply)])]
    assert _stream(markers, in_reasoning, pieces) == (reasoning, content)


def test_reasoning_streams_before_the_answer_and_holds_only_a_possible_marker():
    parser = ReasoningParser(THINK)
    assert parser.feed("<think>\nfirst") == ("first", "")
    assert parser.feed(" idea</thi") == (" idea", "")
    assert parser.in_reasoning
    assert parser.feed("nk>\n\nThe answer") == ("", "The answer")
    assert parser.finish() == ("", "")


def test_markers_come_from_the_template():
    qwen3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    assert reasoning_markers(qwen3) == THINK and supports_thinking_switch(qwen3)
    for name in ("Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
                 "google-gemma-3-4b-it.jinja"):
        text = (TEMPLATES / name).read_text()
        assert reasoning_markers(text) is None and not supports_thinking_switch(text)
    assert reasoning_markers("{{ '[THINK]' }}x{{ '[/THINK]' }}") == MISTRAL_THINK
    assert reasoning_markers(None) is None


def test_prompt_that_opens_the_think_block_starts_the_reply_inside_it():
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n", THINK)
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)  # thinking off
    assert not starts_in_reasoning("<|im_start|>assistant\n", THINK)
    assert not starts_in_reasoning("<think>\n", None)


def test_engine_chat_imports_without_torch():
    code = ("import sys, engine.chat; "
            "bad = [m for m in ('torch', 'numpy', 'llguidance', 'engine.model') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
