"""`pagedeck run` on the embedded SmolLM2-135M-Instruct (real, greedy): a one-shot answer from stdin, and an
interactive chat in a pseudo-terminal (pexpect): streamed replies, a second turn that needs the first, / commands,
the input history on the arrow keys, /bye."""
import sys

import pytest

from tests.cli.support import REPO, cli_env, pagedeck

pytestmark = pytest.mark.timeout(600)


def test_one_shot_reads_the_prompt_from_stdin(tmp_path):
    r = pagedeck(["run", "default", "--greedy", "--max-tokens", "20"], cli_env(tmp_path, own_home=False),
                 stdin="What is the capital of France?\n")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and ">>>" not in r.stdout


def test_interactive_chat_keeps_the_conversation_and_history(tmp_path):
    import pexpect

    child = pexpect.spawn(sys.executable, ["-m", "app", "run", "default", "--greedy", "--max-tokens", "30"],
                          cwd=str(REPO), env=cli_env(tmp_path, own_home=False), encoding="utf-8", timeout=300, dimensions=(40, 200))
    try:
        child.expect("/bye to leave")
        child.expect(">>>")
        child.sendline("What is the capital of France?")
        child.expect("Paris")
        child.expect(">>>")
        child.sendline("/set temperature 0.7")
        child.expect("set temperature to 0.7")
        child.sendline("/show")
        child.expect("temperature 0.7")
        child.sendline("/set greedy x")
        child.expect("unknown setting 'greedy'")
        child.sendline("/set temperature 0")  # greedy again: the next replies are the model's likeliest
        child.expect(">>>")
        child.sendline("My name is Ana.")
        child.expect(">>>")
        child.sendline("What is my name?")
        child.expect("Ana")  # only the first turn says it: the history went with the second
        child.expect(">>>")
        child.sendline("/clear")
        child.expect("Cleared")
        child.expect(">>>")
        for _ in range(8):  # up past /clear, the two Ana lines, /set x3 and /show to the first question
            child.send("\x1b[A")
        child.send("\r")
        child.expect("Paris")
        child.expect(">>>")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    history = (tmp_path / "data" / "pagedeck" / "cli_history").read_text()
    assert "What is the capital of France?" in history and "/bye" in history
