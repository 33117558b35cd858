"""Image parts over real HTTP with the official openai client: a text-only model's clear 400 from a real
`python -m engine serve` process, and the bad-image 400s of a model that sees images (the served model's
encode_chat hook gets the decoded PIL images), other requests running on through both."""
from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest
from PIL import Image

from engine.vision.image_input import data_url
from tests.engine.test_image_input import huge_png
from tests.server_support import ServerThread
from tools.processes import free_port, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(400)


def png(size=(32, 24), colour=(10, 200, 30), fmt="PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, fmt)
    return buf.getvalue()


def image_message(url: str, text: str = "What is in this picture?", detail: str | None = None) -> dict:
    spec = {"url": url} | ({"detail": detail} if detail else {})
    return {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": spec}]}


@pytest.fixture(scope="module")
def serve(tiny_llama_folder):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(tiny_llama_folder),
                             "--port", str(port), "--threads", "1", "--cache-tokens", "1024",
                             "--default-max-tokens", "8", "--allow-remote-images"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)
        yield url
    finally:
        stop(proc)


def test_text_only_model_answers_a_clear_400_and_keeps_serving(serve):
    client = openai.OpenAI(base_url=serve + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to ten"}],
                                            max_tokens=64, stream=True, temperature=0)
    first = next(iter(stream))  # a request already running while the image request is refused
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, max_tokens=4,
                                       messages=[image_message(data_url(png(), "image/png"), detail="low")])
    err = info.value.body
    assert info.value.status_code == 400
    assert err["code"] == "model_cannot_see_images" and err["param"] == "messages[0].content[1]"
    assert "this model cannot see images" in err["message"] and model in err["message"]
    rest = [c for c in stream]
    assert first.choices[0].delta.role == "assistant" and rest[-1].choices[0].finish_reason in ("length", "stop")
    ok = client.chat.completions.create(model=model, max_tokens=4, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_openapi_describes_image_parts(serve):
    import json
    import urllib.request

    spec = json.loads(urllib.request.urlopen(serve + "/openapi.json", timeout=60).read())
    text = json.dumps(spec)
    assert '"const": "image_url"' in text and "model_cannot_see_images" in text and "--allow-remote-images" in text


@pytest.fixture(scope="module")
def seeing(tiny_llama_folder):
    """A served model that sees images, standing in for a vision model: its encode_chat (the hook the
    vision engine fills) records the images it is handed and encodes the text parts with the real tokenizer."""
    with ServerThread(tiny_llama_folder) as s:
        served, seen = s.served, []

        def encode_chat(messages, plan):
            seen.append([p["image"] for m in messages if isinstance(m["content"], list)
                         for p in m["content"] if p["type"] == "image"])
            text = " ".join(p.get("text", "") if isinstance(m["content"], list) else m["content"]
                            for m in messages for p in (m["content"] if isinstance(m["content"], list) else [{}]))
            return served.tokenizer.encode(text or "x"), None

        served.can_see_images = True
        served.encode_chat = encode_chat
        s.seen = seen
        yield s


def bad_request(client, model, url) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, max_tokens=4, messages=[image_message(url)])
    return info.value.body


def test_images_reach_the_engine_decoded(seeing):
    client = seeing.client()
    gif = io.BytesIO()
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=50)
    out = client.chat.completions.create(model=seeing.model_name, max_tokens=3, messages=[
        {"role": "system", "content": "You see images."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png((40, 30)), "image/png")}},
                                     {"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": {"url": data_url(gif.getvalue(), "image/gif"),
                                                                         "detail": "high"}}]}])
    assert out.choices[0].finish_reason in ("length", "stop")
    images = seeing.seen[-1]
    assert [im.size for im in images] == [(40, 30), (8, 8)] and all(im.mode == "RGB" for im in images)
    assert images[0].getpixel((1, 1)) == (10, 200, 30) and images[1].getpixel((1, 1)) == (255, 0, 0)


def test_bad_images_are_400s_naming_the_problem_and_others_keep_running(seeing):
    client = seeing.client()
    model = seeing.model_name
    results = []
    runner = threading.Thread(target=lambda: results.append(client.chat.completions.create(
        model=model, max_tokens=48, temperature=0, messages=[{"role": "user", "content": "Tell me a story"}])))
    runner.start()
    corrupt = data_url(b"hello world, not a picture" * 4, "image/png")
    cases = {
        corrupt: "not an image",
        data_url(png()[:60], "image/png"): "corrupt",
        data_url(png(fmt="TIFF"), "image/tiff"): "unsupported image format TIFF",
        data_url(huge_png(9000, 9000), "image/png"): "9000x9000 = 81,000,000 pixels, over the limit",
        "data:image/png;base64," + "A" * (30 * 2**20): "over the 20.0 MiB limit",
        "http://127.0.0.1:9/x.png": "remote image URLs are off on this server",
        "ftp://example.com/a.png": "unsupported image URL scheme 'ftp'",
    }
    for url, problem in cases.items():
        err = bad_request(client, model, url)
        assert problem in err["message"], (problem, err)
        assert err["param"] == "messages[0].content[1].image_url" and err["code"] == "invalid_image"
    with pytest.raises(openai.BadRequestError, match="detail must be auto, low or high"):
        client.chat.completions.create(model=model, max_tokens=4, messages=[image_message(
            data_url(png(), "image/png"), detail="ultra")])
    with pytest.raises(openai.BadRequestError, match="images go in user messages only"):
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "system", "content": [{"type": "image_url", "image_url": {"url": data_url(png(), "image/png")}}]},
            {"role": "user", "content": "hi"}])
    runner.join(120)
    assert results and results[0].choices[0].finish_reason in ("length", "stop")
