"""`pagedeck ls`: the models of a folder added in the Model tab (model_folders.json), described as the Model tab
describes them, as JSON and as a table; the help lists every command."""
import json

import pytest

from tests.cli.support import cli_env, data_dir, pagedeck

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def models_folder(tmp_path, tiny_llama_folder):
    from tests.tiny_models import write_tiny_gguf

    folder = tmp_path / "my models"
    (folder / "sub").mkdir(parents=True)
    write_tiny_gguf(tiny_llama_folder, folder / "tiny-Q8_0.gguf", "Q8_0")
    write_tiny_gguf(tiny_llama_folder, folder / "sub" / "tiny-F16.gguf", "F16")
    (folder / "broken.gguf").write_bytes(b"GGUF but not really")
    return folder


def test_ls_json_lists_the_added_folder(tmp_path, models_folder):
    env = cli_env(tmp_path)
    data_dir(env).mkdir(parents=True)
    (data_dir(env) / "model_folders.json").write_text(json.dumps({"folders": [str(models_folder)]}))
    r = pagedeck(["ls", "--json"], env)
    assert r.returncode == 0, r.stderr
    rows = {m["name"]: m for m in json.loads(r.stdout)}
    assert set(rows) == {"tiny-Q8_0.gguf", "sub/tiny-F16.gguf", "broken.gguf"}
    q8, f16, broken = rows["tiny-Q8_0.gguf"], rows["sub/tiny-F16.gguf"], rows["broken.gguf"]
    assert q8["architecture"] == "llama" and q8["quantization"] == "Q8_0" and f16["quantization"] == "F16"
    assert q8["size_bytes"] == (models_folder / "tiny-Q8_0.gguf").stat().st_size
    assert q8["parameters"] > 0 and q8["fits"] is True and q8["needs_bytes"] > q8["size_bytes"] * 0.5
    assert q8["source"] == "Added folder" and q8["supported"] and q8["problem"] is None
    assert not broken["supported"] and broken["problem"] and broken["fits"] is None

    table = pagedeck(["ls"], env)
    assert table.returncode == 0, table.stderr
    assert "tiny-Q8_0.gguf" in table.stdout and "Q8_0" in table.stdout and "broken.gguf: not supported" in table.stdout


def test_ls_with_no_models_says_how_to_get_one(tmp_path):
    r = pagedeck(["ls", "--json"], cli_env(tmp_path))
    assert r.returncode == 0 and json.loads(r.stdout) == []
    said = " ".join(pagedeck(["ls"], cli_env(tmp_path)).stdout.split())  # rich wraps the line
    assert "pagedeck get" in said and "`pagedeck run default`" in said


def test_help_lists_the_commands_and_app_flags(tmp_path):
    r = pagedeck(["--help"], cli_env(tmp_path))
    assert r.returncode == 0
    for line in ("run         Chat with a model in the terminal", "ls          List the models", "get ", "serve ",
                 "--install-desktop"):
        assert line in r.stdout
    bad = pagedeck(["run"], cli_env(tmp_path))
    assert bad.returncode == 2 and "MODEL" in bad.stderr


def test_completion_script_names_the_commands(tmp_path):
    r = pagedeck(["completion", "bash"], cli_env(tmp_path))
    assert r.returncode == 0 and "complete -F _pagedeck pagedeck" in r.stdout and "ls get rm" in r.stdout.replace(
        "run ls", "ls").replace("serve ", "")
