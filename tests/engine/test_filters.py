"""Filters driven token by token with the default tokenizer: whatever path is taken through the masks, the
decoded output satisfies the constraint, and can_end / done say when it may and must stop."""
import json
import re

import numpy as np
import pytest

from engine.generator.filters import (ChoiceFilter, Filter, GrammarFilter, JSONSchemaFilter, RegexFilter,
                            llg_tokenizer)
from engine.model.tokenizer import Tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from tests.tiny_models import default_tokenizer

    return default_tokenizer()  # shared with other test modules, so llguidance's view is built once


def drive(f: Filter, tok: Tokenizer, rng: np.random.Generator, max_steps: int = 200,
          p_stop: float = 0.3, random_steps: int = 1000, closer=min) -> str:
    """Walk the filter's masks: a random allowed token for `random_steps` steps, then `closer`'s pick (the
    lowest id by default: punctuation, which closes strings and objects). Returns the text generated."""
    f.begin(tok)
    stops = sorted(tok.stop_token_ids)
    out = bytearray()
    for step in range(max_steps):
        if f.done:
            assert f.can_end
            allowed = np.flatnonzero(f.mask())
            assert set(allowed) == set(stops), "a finished filter allows only stop tokens"
            break
        mask = f.mask()
        assert mask.dtype == np.bool_ and mask.shape == (tok.vocab_size,)
        assert mask[stops].all() == f.can_end and mask[stops].any() == f.can_end
        content = [i for i in np.flatnonzero(mask) if i not in tok.stop_token_ids]
        if f.can_end and (not content or rng.random() < p_stop):
            f.feed(int(rng.choice(stops)))
            assert f.done
            break
        assert content, "a filter that cannot end must allow something"
        token = int(rng.choice(content)) if step < random_steps else int(closer(content))
        f.feed(token)
        out += tok.token_bytes(token)
    else:
        pytest.fail(f"no end after {max_steps} tokens: {bytes(out)!r}")
    return out.decode("utf-8")  # strict: the grammar never leaves half a character


def feed_text(f: Filter, tok: Tokenizer, text: str) -> None:
    """Feed the canonical tokenization of `text`, checking each token was allowed first."""
    for t in tok.encode(text)[0].tolist():
        assert f.mask()[t], f"{tok.token_bytes(t)!r} should be allowed"
        f.feed(t)


# ------------------------------------------------------------------------------------------ tokenizer view
def test_llguidance_sees_the_same_vocabulary(tok):
    ll = llg_tokenizer(tok)
    assert llg_tokenizer(tok) is ll  # built once per tokenizer
    assert ll.vocab_size == tok.vocab_size and ll.eos_token == tok.eos_token_id
    assert all(ll.decode_bytes([i]) == tok.token_bytes(i) for i in range(tok.vocab_size))
    assert all(ll.is_special_token(i) for i in tok.special_token_ids)
    assert ll.tokenize_str("Hello, world") == tok.encode("Hello, world")[0].tolist()


# ------------------------------------------------------------------------------------------ choice
CHOICES = ["yes", "no", "yesterday", 'say "hi"\nthen', "héllo wörld", "42"]


@pytest.mark.parametrize("seed", range(6))
def test_choice_random_walk_gives_one_choice(tok, seed):
    text = drive(ChoiceFilter(CHOICES), tok, np.random.default_rng(seed))
    assert text in CHOICES


@pytest.mark.parametrize("choice", CHOICES)
def test_choice_each_choice_is_reachable_and_ends(tok, choice):
    f = ChoiceFilter(CHOICES)
    f.begin(tok)
    assert not f.can_end and not f.done
    feed_text(f, tok, choice)
    assert f.can_end
    assert f.done == (choice != "yes")  # "yes" may still become "yesterday"


def test_choice_prefix_can_end_but_is_not_done(tok):
    f = ChoiceFilter(["yes", "yesterday"])
    f.begin(tok)
    feed_text(f, tok, "yes")
    assert f.can_end and not f.done
    allowed = f.mask()
    assert allowed[tok.eos_token_id] and allowed[tok.encode("terday")[0, 0].item()]
    f.feed(tok.eos_token_id)
    assert f.done


def test_choice_rejects_text_outside_the_list(tok):
    f = ChoiceFilter(["apple", "banana"])
    f.begin(tok)
    cherry = tok.encode("cherry")[0, 0].item()
    assert not f.mask()[cherry]
    assert not f.mask()[tok.eos_token_id]  # cannot end before a choice is complete
    with pytest.raises(ValueError, match="not allowed"):
        f.feed(cherry)


def test_any_stop_token_ends_the_grammar(tok):
    other_stop = next(i for i in tok.stop_token_ids if i != tok.eos_token_id)
    f = ChoiceFilter(["ok"])
    f.begin(tok)
    feed_text(f, tok, "ok")
    assert f.mask()[other_stop]
    f.feed(other_stop)
    assert f.done


# ------------------------------------------------------------------------------------------ regex
@pytest.mark.parametrize("pattern", [r"[A-Z][a-z]{2,6}-\d{2}", r"(cat|dog)s? (and|or) [0-9]+\.[0-9]{1,2}",
                                     r"[^\n]{1,10}!"])
@pytest.mark.parametrize("seed", range(4))
def test_regex_random_walk_matches(tok, pattern, seed):
    text = drive(RegexFilter(pattern), tok, np.random.default_rng(seed), random_steps=8)
    assert re.fullmatch(pattern, text), text


def test_regex_can_end_tracks_the_match(tok):
    f = RegexFilter(r"ab+c?")
    f.begin(tok)
    feed_text(f, tok, "a")
    assert not f.can_end
    feed_text(f, tok, "bb")
    assert f.can_end and not f.done  # more b's or a c may follow
    feed_text(f, tok, "c")
    assert f.can_end and f.done


# ------------------------------------------------------------------------------------------ JSON schema
def check_person(value) -> None:
    """PERSON's constraints, checked by hand (no jsonschema dependency)."""
    assert isinstance(value, dict)
    assert set(value) <= {"name", "age", "role", "tags"} and {"name", "age", "role"} <= set(value)
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert type(value["age"]) is int and 0 <= value["age"] <= 130
    assert value["role"] in ("admin", "user")
    tags = value.get("tags", [])
    assert isinstance(tags, list) and len(tags) <= 3 and all(type(t) is bool for t in tags)


@pytest.mark.parametrize("seed", range(8))
def test_json_schema_random_walk_validates(tok, seed):
    text = drive(JSONSchemaFilter(PERSON), tok, np.random.default_rng(seed), max_steps=300, random_steps=40)
    check_person(json.loads(text))


def test_json_schema_as_string_and_fixed_whitespace(tok):
    f = JSONSchemaFilter(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                                     "required": ["a"], "additionalProperties": False}))
    f.begin(tok)
    feed_text(f, tok, '{"a": 5')
    newline = tok.encode("\n")[0, 0].item()
    assert not f.mask()[newline]
    feed_text(f, tok, "}")
    assert f.can_end and f.done


def test_json_schema_rejects_a_wrong_type(tok):
    f = JSONSchemaFilter({"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]})
    f.begin(tok)
    feed_text(f, tok, '{"age": ')
    assert not f.mask()[tok.encode('"')[0, 0].item()]  # a string cannot start here
    assert f.mask()[tok.encode("7")[0, 0].item()]


# ------------------------------------------------------------------------------------------ Lark grammar
NESTED = 'start: "(" start ")" | "x"'  # not a regular language: parentheses must balance


@pytest.mark.parametrize("seed", range(4))
def test_grammar_random_walk_balances(tok, seed):
    def close(ids):  # anything without an opening parenthesis
        return min(ids, key=lambda i: b"(" in tok.token_bytes(i))

    text = drive(GrammarFilter(NESTED), tok, np.random.default_rng(seed), random_steps=6, closer=close)
    depth = text.index("x")
    assert text == "(" * depth + "x" + ")" * depth


# ------------------------------------------------------------------------------------------ state handling
def test_mask_is_cached_per_state_and_read_only(tok):
    f = RegexFilter(r"[a-z]+")
    f.begin(tok)
    m = f.mask()
    assert f.mask() is m
    with pytest.raises(ValueError):
        m[0] = True
    feed_text(f, tok, "abc")
    assert f.mask() is not m


def test_begin_resets_a_filter(tok):
    f = ChoiceFilter(["one"])
    f.begin(tok)
    feed_text(f, tok, "one")
    assert f.done
    f.begin(tok)
    assert not f.can_end and not f.done


def test_mask_on_a_worker_thread_matches(tok):
    from concurrent.futures import ThreadPoolExecutor

    f, g = JSONSchemaFilter(PERSON), JSONSchemaFilter(PERSON)
    f.begin(tok)
    g.begin(tok)
    with ThreadPoolExecutor(1) as pool:  # the generator's background evaluation does this
        for text in ('{"name": ', '"Bo"', ', "age": 3'):
            assert np.array_equal(pool.submit(f.mask).result(), g.mask())
            feed_text(f, tok, text)
            feed_text(g, tok, text)


def test_feeding_a_token_outside_the_vocabulary_raises(tok):
    f = RegexFilter("a+")
    f.begin(tok)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        f.feed(tok.vocab_size + 3)


def test_use_before_begin_raises():
    f = ChoiceFilter(["a"])
    assert not f.can_end and not f.done  # not started; hasattr() checks must not blow up
    with pytest.raises(RuntimeError, match="begin"):
        f.mask()
    with pytest.raises(RuntimeError, match="begin"):
        f.feed(1)


@pytest.mark.parametrize("make, message", [
    (lambda: RegexFilter("(abc"), "invalid regex"),
    (lambda: RegexFilter("[z-a]"), "invalid regex"),
    (lambda: JSONSchemaFilter({"type": "frobnicate"}), "invalid JSON schema"),
    (lambda: JSONSchemaFilter({"type": "string", "minLength": 5, "maxLength": 2}), "invalid JSON schema"),
    (lambda: JSONSchemaFilter('{"type": '), "not valid JSON"),
    (lambda: JSONSchemaFilter(["not", "a", "schema"]), "JSON schema is an object"),
    (lambda: GrammarFilter("start: undefined_rule"), "invalid Lark grammar"),
    (lambda: ChoiceFilter([]), "non-empty list"),
    (lambda: ChoiceFilter("yes"), "non-empty list"),
    (lambda: ChoiceFilter(["a", 3]), "strings"),
])
def test_bad_input_raises_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def generator(tok):
    from engine import DynamicGenerator, Model, PagedCache

    model = Model.load()
    return DynamicGenerator(model, PagedCache(model, 2048, 256), tok)


def run_filtered(generator, tok, question: str, f: Filter, max_new_tokens: int = 64) -> dict:
    """Greedy chat reply under filter `f`; returns the job's final (eos) result."""
    from engine import DynamicJob, SamplerSettings

    prompt = tok.apply_chat_template([{"role": "user", "content": question}])
    job = DynamicJob(tok.encode(prompt, encode_special_tokens=True), max_new_tokens, filters=[f],
                     filter_prefer_eos=True, gen_settings=SamplerSettings.greedy(),
                     stop_conditions=sorted(tok.stop_token_ids))
    generator.enqueue(job)
    while True:
        for r in generator.iterate():
            if r["stage"] == "streaming" and r["eos"]:
                return r


@pytest.mark.slow
def test_json_schema_constrains_the_default_model(generator, tok):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    r = run_filtered(generator, tok, "Make up a person. Reply with their name and age as JSON.",
                     JSONSchemaFilter(schema), max_new_tokens=80)
    value = json.loads(r["full_completion"])
    assert set(value) == {"name", "age"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 40
    assert type(value["age"]) is int and 0 <= value["age"] <= 150
    assert r["eos_reason"] == "end_filter"  # the closing brace finishes the grammar


@pytest.mark.slow
def test_choice_constrains_the_default_model(generator, tok):
    choices = ["red", "green", "blue", "none of these"]
    r = run_filtered(generator, tok, "What colour is the sky on a clear day?", ChoiceFilter(choices))
    assert r["full_completion"] in choices


@pytest.mark.slow
def test_filter_prefer_eos_stops_at_the_first_complete_choice(generator, tok):
    r = run_filtered(generator, tok, "What is the capital of France? Answer in full.",
                     ChoiceFilter(["Paris", "Paris is the capital of France."]))
    # Without the preference greedy goes on to the long answer (checked by hand); with it, EOS wins.
    assert r["full_completion"] == "Paris" and r["eos_reason"] == "stop_token"
