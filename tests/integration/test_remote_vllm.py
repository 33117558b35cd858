"""The remote-backend client tests (tests/remote_cases.py) against a real vLLM CPU server (`make test-vllm`)."""
from types import SimpleNamespace

import pytest

from engine import envs
from tests.remote_cases import *  # noqa: F401,F403 - the shared test functions

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def remote():
    return SimpleNamespace(url=envs.PAGEDECK_VLLM_URL, key=None)
