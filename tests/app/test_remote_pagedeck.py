"""The remote-backend client tests (tests/remote_cases.py) against pagedeck's own server and default model."""
from types import SimpleNamespace

import pytest

from tests.remote_cases import *  # noqa: F401,F403 - the shared test functions
from tests.server_support import ServerThread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def remote():
    # dense fp32: the engine promises the same greedy reply for a repeated request (cold, then from the prefix
    # cache) only there; packed weights may flip a near-tie between the two (docs/performance)
    with ServerThread(None, cache_tokens=8192, page_size=256, api_key="pagedeck-test", weights="dense") as server:
        yield SimpleNamespace(url=server.url, key="pagedeck-test", server=server)
