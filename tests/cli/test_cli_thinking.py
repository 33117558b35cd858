"""`pagedeck run` with a thinking model (a scripted tiny model, tests/scripted_models.py, whose greedy reply is
`<think>pondering</think>answer` in a template with Qwen3's markers): the reasoning is folded into one line in
the chat (/think unfolds it), left out of a one-shot answer, and shown with --think."""
import re
import sys

import pytest

from tests.cli.support import REPO, ask, cli_env, pagedeck
from tests.scripted_models import write_scripted_model

pytestmark = pytest.mark.timeout(300)

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"  # drops old thinking: names Qwen3's markers
            "{% if m.role == 'assistant' and '</think>' in m.content %}{{ m.content.split('</think>')[-1] }}"
            "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    return write_scripted_model(tmp_path_factory.mktemp("thinker") / "m",
                                ["<think>", "pondering", "</think>", "answer"], TEMPLATE)


def test_one_shot_leaves_the_reasoning_out_unless_asked(tmp_path, thinker):
    env = cli_env(tmp_path, own_home=False)
    r = pagedeck(["run", str(thinker), "--greedy", "--max-tokens", "16", "hi"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "answer"
    shown = pagedeck(["run", str(thinker), "--greedy", "--max-tokens", "16", "--think", "hi"], env)
    assert shown.returncode == 0, shown.stderr
    assert "pondering" in shown.stdout and shown.stdout.rstrip().endswith("answer")


def test_chat_folds_the_reasoning_and_think_unfolds_it(tmp_path, thinker):
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "app", "run", str(thinker), "--greedy", "--max-tokens", "16"],
                          cwd=str(REPO), env=cli_env(tmp_path, own_home=False), encoding="utf-8", timeout=240,
                          dimensions=(40, 200))
    try:
        child.expect(r"\x1b\[\?2004h")  # the first prompt
        reply = ask(child, "hi")
        assert re.search(r"Thought for [0-9.]+s \(/think shows it\)", reply) and "answer" in reply, reply
        assert "pondering" not in reply  # folded
        assert "pondering" in ask(child, "/think")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
