"""Images through a real vLLM (CPU build, `make test-vllm`): a tiny random SmolVLM (Idefics3, written by
transformers' config classes, tests/tiny_vlms.py) served by vLLM beside pagedeck's own server of the same
folder.

The app's remote backend sends a chat's attached image to vLLM as an OpenAI `image_url` part with a
data: URL and a reply comes back; the same chat to both servers gets the same prompt token count (vLLM's
usage.prompt_tokens against pagedeck's, and the engine's own image_prompt in this process), so the image
expanded to the same tiles, tags and placeholders on both; with greedy sampling both servers answer the
same tokens, each step's top log-probabilities within 1e-3 (the same float32 weights; measured ~1e-5).

The folder's text model has heads of 32 (vLLM's CPU attention refuses 16, the other tiny models' size),
and it needs a processor_config.json naming image_seq_len 16 (the tiny encoder's 8 x 8 patches,
pixel-shuffled by 2): vLLM builds transformers' Idefics3Processor, whose default (169, SmolVLM's 512 px
tiles) would make a 100 x 70 picture 2,241 prompt tokens and overflow the 2,048 context. This module
starts its own vLLM (tools.peers.vllm_server.start_vision, ~2 min on a loaded 2-core machine) for the vision
model; the other integration tests share the text model's.
"""
from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.core.images import attach_bytes
from app.core.remote_backend import RemoteBackend
from app.core.store import ChatSettings
from tests.engine.test_server_images import served_process
from tests.tiny_vlms import IDEFICS3_IMAGE_TOKENS, IMAGE_SIZE, write_tiny_idefics3
from tools.peers import vllm_server
from tools.processes import free_port, wait_healthy

pytestmark = pytest.mark.timeout(900)

QUESTION = "What is in this picture?"
SETTINGS = ChatSettings(max_new_tokens=6, temperature=0.0)


def write_vllm_vlm_folder(folder: Path) -> Path:
    """tests/tiny_vlms.py's tiny SmolVLM with text heads of 32 (vLLM's CPU attention takes head sizes from 32
    up: 16 fails the first request with "Unsupported CPU attention configuration: head_dim=16") and the
    processor's image_seq_len (see the module docstring)."""
    from transformers import Idefics3ImageProcessorPil

    folder.mkdir(parents=True)
    write_tiny_idefics3(folder, 0, max_position_embeddings=2048, hidden_size=128, intermediate_size=256, head_dim=32)
    Idefics3ImageProcessorPil(size={"longest_edge": 4 * IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE},
                              do_image_splitting=True).save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps({"image_seq_len": IDEFICS3_IMAGE_TOKENS,
                                                              "processor_class": "Idefics3Processor"}))
    return folder


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory) -> Path:
    return write_vllm_vlm_folder(tmp_path_factory.mktemp("vllm-vlm") / "tiny-smolvlm")


@pytest.fixture(scope="module")
def vllm_vlm(vlm_folder) -> str:
    port = free_port()
    proc = vllm_server.start_vision(port, vlm_folder)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, proc, vllm_server.START_TIMEOUT_S)
        except RuntimeError as exc:
            log = (vllm_server.WORK / "vision.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"vLLM did not serve the tiny SmolVLM: {exc}\n{log}") from None
        yield url
    finally:
        vllm_server.stop(proc)


@pytest.fixture(scope="module")
def pagedeck_vlm(vlm_folder) -> str:
    with served_process(vlm_folder) as served:
        yield served.url


def picture(seed: int = 1, size=(100, 70)) -> bytes:
    """A noisy PNG (a flat picture would give every tile the same features)."""
    g = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(g.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB").save(buf, "PNG")
    return buf.getvalue()


def chat(image: bytes) -> list[dict]:
    """A chat's history as the app's remote backend gets it (app.core.images.with_images)."""
    return [{"role": "user", "content": QUESTION, "images": [attach_bytes(image)]}]


async def remote_reply(url: str, history: list[dict]) -> tuple[str, int | None]:
    """The reply's text and the server's prompt token count, through the app's RemoteBackend."""
    backend = RemoteBackend(url)
    await backend.connect()
    try:
        job, _ = backend.start_job("images", history, SETTINGS)
        text, prompt_tokens = "", None
        async for r in job:
            text += r.get("text", "")
            if r.get("eos"):
                prompt_tokens = r.get("prompt_tokens")
        backend.job_ended("images")
        return text, prompt_tokens
    finally:
        await backend.close()


def engine_prompt_tokens(folder: Path, image: bytes) -> int:
    """The prompt pagedeck's engine makes of the same chat in this process."""
    from engine import Tokenizer, image_prompt
    from engine.vision import load_vision

    messages = [{"role": "system", "content": SETTINGS.system_prompt},  # the chat's, as the backend sends it
                {"role": "user", "content": [{"type": "text", "text": QUESTION},
                                             {"type": "image", "image": Image.open(io.BytesIO(image)).convert("RGB")}]}]
    ids, _ = image_prompt(messages, Tokenizer.load(folder), load_vision(folder))
    return int(ids.shape[-1])


def test_the_app_s_remote_backend_sends_a_chat_s_image_to_vllm_and_a_reply_comes_back(vllm_vlm):
    text, prompt_tokens = asyncio.run(remote_reply(vllm_vlm, chat(picture())))
    assert text  # six greedy tokens of a random model: noise, but a reply
    assert prompt_tokens is not None and prompt_tokens > 16 * 13  # 4 x 3 tiles and the global view, 16 each


def test_vllm_and_pagedeck_expand_the_image_to_the_same_prompt_and_answer_the_same(vllm_vlm, pagedeck_vlm, vlm_folder):
    image = picture(seed=2, size=(130, 90))
    ours = engine_prompt_tokens(vlm_folder, image)
    vllm_text, vllm_tokens = asyncio.run(remote_reply(vllm_vlm, chat(image)))
    pagedeck_text, pagedeck_tokens = asyncio.run(remote_reply(pagedeck_vlm, chat(image)))
    print(f"\nprompt tokens: vLLM {vllm_tokens}, pagedeck server {pagedeck_tokens}, engine {ours}; "
          f"replies: vLLM {vllm_text!r}, pagedeck {pagedeck_text!r}", file=sys.stderr)
    assert vllm_tokens == pagedeck_tokens == ours
    assert vllm_text == pagedeck_text
    # and the numbers behind the greedy picks: each step's top-2 log-probabilities, on the same image prompt
    vllm_steps, pagedeck_steps = top_logprobs(vllm_vlm, image), top_logprobs(pagedeck_vlm, image)
    assert [t for t, _ in vllm_steps] == [t for t, _ in pagedeck_steps]
    worst = max(abs(a - b) for (_, xs), (_, ys) in zip(vllm_steps, pagedeck_steps) for a, b in zip(xs, ys))
    print(f"top-2 log-probabilities over {len(vllm_steps)} steps differ by at most {worst:.2e}", file=sys.stderr)
    assert worst < 1e-3


def top_logprobs(url: str, image: bytes, steps: int = 6) -> list[tuple[list[str], list[float]]]:
    """Each greedy step's two likeliest tokens and their log-probabilities, asked with the OpenAI client."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "system", "content": SETTINGS.system_prompt},
                {"role": "user", "content": [{"type": "text", "text": QUESTION},
                                             {"type": "image_url", "image_url": {"url": attach_bytes(image).data_url()}}]}]
    r = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, max_tokens=steps,
                                       temperature=0, logprobs=True, top_logprobs=2)
    return [([x.token for x in t.top_logprobs], [x.logprob for x in t.top_logprobs]) for t in r.choices[0].logprobs.content]

