"""How long a `pagedeck run` reply may be: with no --max-tokens it may fill the context (a thinking model
thinks past any fixed cap), a reply that was cut says where, an explicit limit still holds, and /set
max_tokens takes a number or none. The real ChatSession and stream_reply on a tiny random Qwen3 with a
2048-token context, whose greedy reply never reaches its end-of-turn token within it (its loops let run);
the loop guard on the embedded model."""
import re

import pytest

from app.cli.chat_session import ChatSession, Options
from app.cli.run import stream_reply
from engine.contract import SamplerSettings
from tests.tiny_models import write_tiny_model

pytestmark = pytest.mark.timeout(300)

CTX = 2048


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("long") / "m", "qwen3", max_position_embeddings=CTX)
    return ChatSession(folder, ctx=CTX, weights="dense", options=Options(sampler=SamplerSettings.greedy(), stop_on_loops=False))


def test_a_reply_without_a_limit_fills_the_context_and_says_it_was_cut(session, capsys):
    session.clear()
    session.options.max_tokens = None
    assert stream_reply(session, "Think it through.", interactive=False)
    last = session.last
    assert last.eos_reason == "max_new_tokens"
    assert last.new_tokens > 1024 and last.prompt_tokens + last.new_tokens == CTX
    assert f"[cut at the end of the context ({CTX} tokens" in capsys.readouterr().err


def test_an_explicit_limit_holds_and_is_named_when_reached(session, capsys):
    session.clear()
    session.set_option("max_tokens", "40")
    assert stream_reply(session, "Think it through.", interactive=False)
    assert session.last.new_tokens == 40
    assert "[cut at the reply limit (40 tokens" in capsys.readouterr().err


def test_the_oldest_turns_make_room_for_a_quarter_of_the_context(session):
    session.clear()
    session.options.max_tokens = None
    session.history += [{"role": "user", "content": "word " * 700}, {"role": "assistant", "content": "ok " * 1000}]
    kept = len(session.history)
    _, ids, room = session._prompt_ids("And now?")
    assert room >= CTX // 4 and len(session.history) < kept  # the long old turn went, not the reply's room


def test_set_max_tokens_takes_a_number_or_none(session):
    assert session.set_option("max_tokens", "64") == "set max_tokens to 64"
    assert session.options.max_tokens == 64
    session.set_option("max_tokens", "none")
    assert session.options.max_tokens is None
    session.set_option("max_tokens", "-1")  # ollama's "no limit"
    assert session.options.max_tokens is None
    with pytest.raises(ValueError, match="at least 1"):
        session.set_option("max_tokens", "0")


def test_the_default_model_stuck_in_a_loop_is_stopped_and_says_so(tmp_path):
    """The embedded SmolLM2-135M-Instruct, greedy, asked for a long essay, repeats one sentence: without a
    limit that would fill the context; the loop guard ends it at the 4th copy (--allow-loops lets it run)."""
    from tests.cli.support import cli_env, pagedeck

    ask = ["run", "default", "--greedy", "--ctx", "1024",
           "Write a very long essay about the history of Rome, with many sections."]
    stopped = pagedeck(ask, cli_env(tmp_path, own_home=False))
    assert stopped.returncode == 0, stopped.stderr
    assert "[stopped: repeating itself; /set loops lets it run]" in stopped.stderr
    let_run = pagedeck(ask + ["--allow-loops", "--verbose"], cli_env(tmp_path, own_home=False))
    assert "[cut at the end of the context (1024 tokens" in let_run.stderr
    assert len(let_run.stdout) > len(stopped.stdout)


def test_a_long_thought_counts_its_seconds_while_folded(tmp_path_factory, capsys):
    """A reply that thinks until the context is full (the template opens <think> in the prompt and the random
    model never closes it): the folded line shows the thinking's seconds as they pass, not one still line."""
    import json

    folder = write_tiny_model(tmp_path_factory.mktemp("thinks") / "m", "qwen3", max_position_embeddings=CTX)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"  # Qwen3's markers, old thinking
                               "{{ m.content.split('</think>')[-1] }}<|im_end|>\n{% endfor %}"  # dropped
                               "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    thinker = ChatSession(folder, ctx=CTX, weights="dense",
                          options=Options(sampler=SamplerSettings.greedy(), stop_on_loops=False))
    assert stream_reply(thinker, "Think it through.", interactive=True)
    assert thinker.last.reasoning and not thinker.last.content and thinker.last.new_tokens > 1024
    shown = [float(s) for s in re.findall(r"Thinking… ([0-9.]+)s", capsys.readouterr().out)]
    assert len(shown) >= 3 and shown == sorted(shown) and shown[-1] >= 1.0, shown
