"""The remote backend keeps a thinking model's reasoning apart from its reply (vLLM's reasoning_content,
as pagedeck's server sends it too), against a live server with a scripted tiny thinking model."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.remote_backend import RemoteBackend
from app.core.store import ChatSettings
from tests.scripted_models import write_scripted_model
from tests.server_support import ServerThread

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
SCRIPT = ["<think>", "\nFrance's capital.\n", "</think>", "\n\n", "Paris."]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_scripted_model(tmp_path_factory.mktemp("think") / "m", SCRIPT,
                                  (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    with ServerThread(folder) as s:
        yield s


def test_reasoning_deltas_arrive_apart_from_the_text(server):
    async def body():
        backend = RemoteBackend(server.url)
        await backend.connect()
        try:
            settings = ChatSettings(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0, max_new_tokens=20)
            job, _ = backend.start_job("t", [{"role": "user", "content": "Capital of France?"}], settings)
            return [r async for r in job]
        finally:
            backend.job_ended("t")
            await backend.close()

    results = asyncio.run(body())
    streaming = [r for r in results if r["stage"] == "streaming"]
    assert "".join(r.get("reasoning", "") for r in streaming) == "France's capital."
    assert "".join(r["text"] for r in streaming) == "Paris."
    assert not any(r.get("reasoning") and r["text"] for r in streaming)
    assert streaming[-1]["eos"] and streaming[-1]["eos_reason"] == "stop"
