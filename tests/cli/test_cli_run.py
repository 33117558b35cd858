"""`pagedeck run` on the embedded SmolLM2-135M-Instruct (real, greedy): a one-shot answer from stdin, and an
interactive chat in a pseudo-terminal (pexpect): streamed replies, a second turn whose prompt carries the first,
/ commands (/set verbose counts the tokens),
the input history on the arrow keys, /bye."""
import re
import sys

import pytest

from tests.cli.support import REPO, ask, cli_env, pagedeck

pytestmark = pytest.mark.timeout(600)


def test_one_shot_reads_the_prompt_from_stdin(tmp_path):
    r = pagedeck(["run", "default", "--greedy", "--max-tokens", "20"], cli_env(tmp_path, own_home=False),
                 stdin="What is the capital of France?\n")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and ">>>" not in r.stdout


def counts(reply: str) -> tuple[int, int]:
    """(prompt tokens, reply tokens) from the line --verbose / `/set verbose` prints after a reply."""
    found = re.search(r"\[prompt (\d+) tokens, reply (\d+) tokens", reply)
    assert found, reply
    return int(found.group(1)), int(found.group(2))


def test_interactive_chat_keeps_the_conversation_and_history(tmp_path):
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "app", "run", "default", "--greedy", "--max-tokens", "30"],
                          cwd=str(REPO), env=cli_env(tmp_path, own_home=False), encoding="utf-8", timeout=300,
                          dimensions=(40, 200))
    try:
        child.expect("/bye to leave")
        child.expect(r"\x1b\[\?2004h")  # the first prompt
        assert "Paris" in ask(child, "What is the capital of France?")
        assert "set temperature to 0.7" in ask(child, "/set temperature 0.7")
        assert "temperature 0.7" in ask(child, "/show")
        assert "unknown setting 'greedy'" in ask(child, "/set greedy x")
        ask(child, "/set temperature 0")  # greedy again: the next replies are the model's likeliest
        assert "token counts are shown" in ask(child, "/set verbose")
        assert "Cleared" in ask(child, "/clear")
        first, reply = counts(ask(child, "Hello"))
        second, _ = counts(ask(child, "Hello"))
        assert second > first + reply  # the second prompt carries the first turn: question and reply
        assert "Cleared" in ask(child, "/clear")
        assert counts(ask(child, "Hello"))[0] == first  # forgotten
        # up past Hello, /clear, Hello x2, /clear, /set x4 and /show to the first question, then Enter
        assert "Paris" in ask(child, None, "\x1b[A" * 11 + "\r")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    history = (tmp_path / "data" / "pagedeck" / "cli_history").read_text()
    assert "What is the capital of France?" in history and "/bye" in history
