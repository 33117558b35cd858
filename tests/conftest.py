"""Suite-wide set-up: Triton's CPU interpreter and offscreen Qt must be chosen before anything imports them."""
import os

from engine import envs

if not envs.PAGEDECK_TRITON_NATIVE:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


def pytest_sessionstart(session):
    """Build pagedeck's CPU kernels (kernels.cpu_ext) once, up front, into torch's extension cache (outside the
    tree): ~40 s of compiler time on a fresh machine, paid here rather than inside a test or a server
    subprocess with its own start-up timeout. Afterwards it only loads (~1 s).

    Where a C++ compiler is present and the kernels are on, a failed build stops the run: every kernel test
    would skip as "did not build" and the run pass without them."""
    import shutil

    from kernels import cpu_ext

    if cpu_ext.ops() is None and cpu_ext.enabled() and shutil.which(os.environ.get("CXX", "c++")):
        pytest.exit("pagedeck's CPU kernels failed to build here although a C++ compiler is present (the "
                    "compiler's words are in the warning above); their tests would all skip", returncode=1)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory):
    """One tiny random Llama on disk for the whole run (HF format, with the default tokenizer)."""
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama")


@pytest.fixture(scope="session")
def tiny_vlm_folder(tmp_path_factory):
    """One tiny random SmolVLM (Idefics3) folder for the whole run: model, tokenizer with its chat template,
    image processor config (a real server or the app loads its vision tower)."""
    from tests.tiny_vlms import write_tiny_vlm_folder

    return write_tiny_vlm_folder(tmp_path_factory.mktemp("tiny-vlm") / "tiny-smolvlm")


@pytest.fixture
def monkeypatch(monkeypatch):
    """pytest's monkeypatch, except that its setenv and delenv of a variable engine.envs defines make envs read
    that variable again (envs reads each once and keeps it), and so does its undo at the test's end."""
    for method in ("setenv", "delenv"):
        def changed(name, *args, _plain=getattr(monkeypatch, method), **kwargs):
            _plain(name, *args, **kwargs)
            if name in envs.VARIABLES:
                envs.refresh(name)
        setattr(monkeypatch, method, changed)
    yield monkeypatch
    monkeypatch.undo()
    envs.refresh()


@pytest.fixture(autouse=True)
def _private_preferences(tmp_path_factory, monkeypatch):
    """Every test gets its own preferences file (app.preferences.preferences): none reads or writes the user's."""
    monkeypatch.setenv("PAGEDECK_SETTINGS", str(tmp_path_factory.mktemp("prefs") / "pagedeck.ini"))


@pytest.fixture(autouse=True, scope="session")
def _private_tokenizer_cache(tmp_path_factory):
    """The session's tokenizers keep their recovered merges in a scratch folder, never the user's cache."""
    os.environ["PAGEDECK_TOKENIZER_CACHE"] = str(tmp_path_factory.mktemp("tokenizer-cache"))
    envs.refresh("PAGEDECK_TOKENIZER_CACHE")


@pytest.fixture(autouse=True)
def _fresh_chat_colours():
    """Every test starts with no chat colour held: windows earlier tests left open (not yet collected) still
    hold theirs in the process-wide book, and with the 16-colour palette full two new chats could share one."""
    from app.core.chat_colours import CHAT_COLOURS

    CHAT_COLOURS._slot.clear(), CHAT_COLOURS._holds.clear(), CHAT_COLOURS._labels.clear()
    yield
