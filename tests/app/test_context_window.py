"""The context overflow policies as pure functions (app.core.context_window): a chat's messages and a token
count in, the kept messages out. Properties over random chats: the system prompt and the latest turn always
stay, turns stay whole and in order, the result fits whenever the smallest prompt the policy may make fits,
and no more is left out than needed; then each policy's own shape (rolling: a suffix of turns; truncate
middle: the first and pinned turns stay while the middle can give; stop: nothing is left out)."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.context import ContextFull, fit_context
from app.core.context_window import (
    POLICIES, ROLLING_WINDOW, STOP_AT_LIMIT, TRUNCATE_MIDDLE, drop_order, fit_turns, turn_spans,
)
from app.core.store import ChatSettings


@st.composite
def chats(draw):
    """(messages, overhead): 0-2 system messages, maybe an assistant greeting, then turns (a user message
    and 0-3 replies, tool calls or results); each message costs n tokens, some carry an image."""
    messages = [{"role": "system", "n": draw(st.integers(0, 80))} for _ in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        messages.append({"role": "assistant", "n": draw(st.integers(0, 80))})
    for _ in range(draw(st.integers(1, 9))):
        messages.append({"role": "user", "n": draw(st.integers(0, 120)), "images": draw(st.booleans()) and ["img"]})
        for _ in range(draw(st.integers(0, 3))):
            messages.append({"role": draw(st.sampled_from(["assistant", "tool"])), "n": draw(st.integers(0, 120))})
    for i, m in enumerate(messages):
        m["content"] = f"m{i}"
    return messages, draw(st.integers(0, 30))


def counter(overhead: int):
    """A template's count: a fixed overhead, each message's tokens, and 3 more per turn (not a plain sum)."""
    def count(msgs: list[dict]) -> int:
        return overhead + sum(m["n"] for m in msgs) + 3 * sum(m["role"] == "user" for m in msgs)
    return count


def pinned(m: dict) -> bool:
    return bool(m.get("images"))


@settings(max_examples=400, deadline=None)
@given(chats(), st.integers(0, 1500), st.sampled_from(POLICIES))
def test_every_policy_keeps_the_system_prompt_and_the_latest_turn_whole_and_in_order(chat, budget, policy):
    messages, overhead = chat
    before = copy.deepcopy(messages)
    count = counter(overhead)
    w = fit_turns(messages, count, budget, policy, pinned)
    assert messages == before  # the stored history is never changed
    head, spans = turn_spans(messages)
    kept = set(w.kept)
    assert list(w.kept) == sorted(kept)  # order preserved
    assert set(range(head)) <= kept  # system prompt always kept
    last = spans[-1]
    assert set(range(*last)) <= kept  # the latest turn (the user message being answered) always kept
    assert messages[last[0]]["role"] in ("user", "assistant")
    for a, b in spans:  # whole turns only
        assert set(range(a, b)) <= kept or not set(range(a, b)) & kept
    dropped = [t for t, (a, b) in enumerate(spans) if a not in kept]
    assert w.dropped_turns == len(dropped) and w.dropped_messages == len(messages) - len(kept)
    assert w.tokens == count(w.messages(messages))
    order = drop_order(len(spans), policy, [any(pinned(messages[i]) for i in range(a, b)) for a, b in spans])
    assert dropped == sorted(order[:len(dropped)])  # left out in the policy's order, no other turns
    smallest = count([messages[i] for i in range(head)] + [messages[i] for t in range(len(spans))
                                                           if t not in order for i in range(*spans[t])])
    if smallest <= budget:
        assert w.tokens <= budget  # the result fits whenever it can
    else:
        assert w.dropped_turns == len(order)  # it can't: the smallest prompt, for the caller to refuse
    if w.dropped_turns:  # nothing more than needed was left out: one turn fewer would not fit
        back = set(order[:len(dropped) - 1])
        one_fewer = [messages[i] for i in range(head)] + [messages[i] for t in range(len(spans)) if t not in back
                                                          for i in range(*spans[t])]
        assert count(one_fewer) > budget
    if policy == STOP_AT_LIMIT:
        assert w.dropped_turns == 0
    if policy == ROLLING_WINDOW:
        assert dropped == list(range(len(dropped)))  # the oldest turns: the kept ones are the latest
    if policy == TRUNCATE_MIDDLE and len(spans) > 1:
        unpinned_middle = [t for t in range(1, len(spans) - 1) if not any(pinned(messages[i]) for i in range(*spans[t]))]
        if w.dropped_turns <= len(unpinned_middle):  # the middle gave enough: first and pinned turns stay
            assert 0 not in dropped and set(dropped) <= set(unpinned_middle)


def test_truncate_middle_keeps_the_opening_and_the_latest_turns_and_leaves_out_the_oldest_middle():
    messages = []
    for i in range(6):
        messages += [{"role": "user", "content": f"q{i}", "n": 100}, {"role": "assistant", "content": f"a{i}", "n": 100}]
    messages.append({"role": "user", "content": "now", "n": 10})
    count = counter(0)  # 13 messages: 1210 + 7 * 3 = 1231 tokens, 203 per earlier turn
    w = fit_turns(messages, count, 700, TRUNCATE_MIDDLE)
    assert [m["content"] for m in w.messages(messages)] == ["q0", "a0", "q4", "a4", "q5", "a5", "now"]
    assert w.dropped_turns == 3 and w.dropped_messages == 6 and w.tokens == 1231 - 3 * 203
    rolling = fit_turns(messages, count, 700, ROLLING_WINDOW)
    assert [m["content"] for m in rolling.messages(messages)] == ["q3", "a3", "q4", "a4", "q5", "a5", "now"]
    messages[3]["images"] = ["img"]  # turn 1 carries an image: pinned, the turn after it goes instead
    w = fit_turns(messages, count, 700, TRUNCATE_MIDDLE, pinned)
    assert [m["content"] for m in w.messages(messages)] == ["q0", "a0", "q1", "a1", "q5", "a5", "now"]
    assert fit_turns(messages, count, 700, STOP_AT_LIMIT).dropped_turns == 0


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown context overflow policy 'drop_all'"):
        drop_order(3, "drop_all")
    with pytest.raises(ValueError, match="context_overflow"):
        ChatSettings(context_overflow="drop_all").validate()


def test_fit_context_stop_at_limit_gives_the_room_left_and_refuses_a_full_chat_saying_what_to_do():
    history = [{"role": "user", "content": "x" * 300}, {"role": "assistant", "content": "y" * 300},
               {"role": "user", "content": "z" * 100}]

    def count(h, s):
        return sum(len(m["content"]) for m in h)

    stop = ChatSettings(context_overflow=STOP_AT_LIMIT)
    fit = fit_context(history, stop, count, 1000)
    assert fit.dropped == 0 and fit.max_new_tokens == 300 and fit.fills_context
    with pytest.raises(ContextFull, match="Context overflow.*Truncate middle.*Rolling window"):
        fit_context(history, stop, count, 700)
    middle = fit_context(history, ChatSettings(), count, 700)  # the default: truncate middle
    assert middle.dropped_turns == 1 and middle.history == history[2:] and middle.max_new_tokens == 600
    with pytest.raises(ContextFull, match="the last message alone"):
        fit_context(history, ChatSettings(), count, 100)


def test_a_chat_saved_with_the_old_switch_keeps_its_behaviour():
    import json

    on, off = (json.dumps({"truncate": v}) for v in (True, False))
    assert ChatSettings.from_json(on).context_overflow == ROLLING_WINDOW
    assert ChatSettings.from_json(off).context_overflow == STOP_AT_LIMIT
    assert ChatSettings.from_json("{}").context_overflow == TRUNCATE_MIDDLE == ChatSettings().context_overflow
    s = ChatSettings(context_overflow=ROLLING_WINDOW)
    assert ChatSettings.from_json(s.to_json()) == s
