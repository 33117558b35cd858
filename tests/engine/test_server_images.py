"""Image parts over real HTTP with the official openai client and real `python -m engine serve` processes:
a text-only model's clear 400; a tiny random SmolVLM folder served with its vision tower, whose answers
share the prompt cache's pages for the same image (not for another), equal the engine's own greedy answer
in this process, and whose bad images are 400s naming the problem, other requests running on."""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from engine.vision.image_input import data_url
from tests.engine.test_image_input import huge_png
from tests.tiny_vlms import write_tiny_vlm_folder
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


def test_openapi_describes_image_parts(serve, seeing):
    """A server whose model sees images describes image parts; every server lists the text-only model's 400."""
    import json
    import urllib.request

    text = json.dumps(json.loads(urllib.request.urlopen(seeing.url + "/openapi.json", timeout=60).read()))
    assert '"const": "image_url"' in text and "model_cannot_see_images" in text and "--allow-remote-images" in text
    assert "model_cannot_see_images" in urllib.request.urlopen(serve + "/openapi.json", timeout=60).read().decode()


class Served:
    """A real `python -m engine serve` process of a vision model."""

    def __init__(self, url: str, folder: Path):
        self.url, self.folder = url, folder

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    @property
    def model_name(self) -> str:
        return self.folder.name


@contextlib.contextmanager
def served_process(folder: Path):
    """A real `python -m engine serve` process of a model folder; it loads the folder's vision tower at start."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(folder),
                             "--port", str(port), "--threads", "1", "--cache-tokens", "2048",
                             "--default-max-tokens", "8"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)
        yield Served(url, folder)
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def seeing(tiny_vlm_folder):
    """The tiny SmolVLM served by a real server process."""
    with served_process(tiny_vlm_folder) as served:
        yield served


def picture(seed: int, size=(100, 70)) -> Image.Image:
    """A noisy RGB picture (a flat one would give every tile the same features)."""
    g = np.random.default_rng(seed)
    return Image.fromarray(g.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def png_of(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def engine_answer(folder: Path, messages: list[dict], max_tokens: int) -> str:
    """The engine's own greedy answer in this process: image_prompt over the model's template, then a
    DynamicJob with the embeddings, stopping where the server stops."""
    from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer, image_prompt
    from engine.vision import load_vision

    model, tok = Model.load(folder), Tokenizer.load(folder)
    ids, embeddings = image_prompt(messages, tok, load_vision(folder))
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=256), tok)
    gen.enqueue(DynamicJob(ids, max_tokens, gen_settings=SamplerSettings.greedy(), embeddings=embeddings,
                           stop_conditions=sorted(tok.stop_token_ids)))
    text = ""
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                text += r.get("text", "")
    return text


def ask(client, model: str, image_png: bytes, text: str = "What is in this picture?", max_tokens: int = 6, **extra):
    return client.chat.completions.create(model=model, max_tokens=max_tokens, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": text},
                                     {"type": "image_url", "image_url": {"url": data_url(image_png, "image/png")}}]}],
        **extra)


def test_a_vision_model_answers_and_shares_pages_of_the_same_image(seeing):
    client, model = seeing.client(), seeing.model_name
    assert client.models.list().data[0].id == model
    a, b = png_of(picture(1)), png_of(picture(2))
    first = ask(client, model, a)
    assert first.choices[0].finish_reason in ("length", "stop") and first.choices[0].message.role == "assistant"
    n = first.usage.prompt_tokens
    assert n > 13 * 16  # 100 x 70 px scaled to 256 x 179: 4 x 3 tiles of 64 px and the global view, 16 tokens each
    again = ask(client, model, a)
    assert again.usage.prompt_tokens == n
    assert again.usage.prompt_tokens_details.cached_tokens >= n - 1  # all of it but the token fed for logits
    assert again.choices[0].message.content == first.choices[0].message.content
    other = ask(client, model, b)
    assert other.usage.prompt_tokens == n  # the same layout
    before_image = len(seeing_prefix(seeing.folder, picture(2)))
    assert 0 < other.usage.prompt_tokens_details.cached_tokens <= before_image  # the text before it, not the image


def seeing_prefix(folder: Path, image: Image.Image) -> list[int]:
    """The test question's prompt ids before the image's first placeholder (what two images may share:
    the template's text and the tile's row/column tag)."""
    from engine import Tokenizer, image_prompt
    from engine.vision import load_vision

    ids, (embedding,) = image_prompt([{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"}, {"type": "image", "image": image}]}],
        Tokenizer.load(folder), load_vision(folder), cache=None)
    ids = ids[0].tolist()
    return ids[: ids.index(embedding.token_ids[0])]


def test_greedy_answer_through_the_server_equals_the_engine_s_own(seeing):
    """Two images (a PNG and an animated GIF: its first frame) and a system prompt: the server's greedy
    reply is the engine's own for the same decoded images."""
    client, model = seeing.client(), seeing.model_name
    gif = io.BytesIO()
    frames = [picture(5, (90, 60)), picture(6, (90, 60))]
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=50)
    png = png_of(picture(4, (40, 30)))
    out = client.chat.completions.create(model=model, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "You see images."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
                                     {"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": {"url": data_url(gif.getvalue(), "image/gif"),
                                                                         "detail": "high"}}]}])
    from engine.vision.image_input import decode_image

    mine = engine_answer(seeing.folder, [
        {"role": "system", "content": "You see images."},
        {"role": "user", "content": [{"type": "image", "image": decode_image(png)}, {"type": "text", "text": "and"},
                                     {"type": "image", "image": decode_image(gif.getvalue())}]}], 8)
    assert out.choices[0].message.content == mine and mine


def bad_request(client, model, url) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, max_tokens=4, messages=[image_message(url)])
    return info.value.body


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


def test_gemma3_through_the_server_answers_as_the_engine_does(tmp_path):
    """A tiny random Gemma 3 VLM served the same way: its greedy answer is the engine's own, and the
    same picture again is served from the cache's pages."""
    folder = write_tiny_vlm_folder(tmp_path / "tiny-gemma3", "gemma3")
    image = picture(9, (80, 50))
    with served_process(folder) as served:
        client = served.client()
        out = ask(client, served.model_name, png_of(image), max_tokens=8)
        again = ask(client, served.model_name, png_of(image))
    mine = engine_answer(folder, [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                                               {"type": "image", "image": image}]}], 8)
    assert out.choices[0].message.content == mine and mine
    assert out.usage.prompt_tokens > 16  # 16 image tokens and their markers, and the text
    assert again.usage.prompt_tokens_details.cached_tokens >= out.usage.prompt_tokens - 1


def test_a_vision_model_reads_text_only_messages_and_image_only_ones(seeing):
    """SmolVLM's template reads contents only as parts: a text-only chat's words reach the prompt (one
    prompt token more per word), and a message holding only an image (no text part) is answered."""
    client, model = seeing.client(), seeing.model_name

    def tokens(text: str) -> int:
        reply = client.chat.completions.create(model=model, max_tokens=1, temperature=0,
                                               messages=[{"role": "user", "content": text}])
        return reply.usage.prompt_tokens

    assert tokens("Hi " * 41) >= tokens("Hi") + 40
    url = data_url(png_of(picture(3)), "image/png")
    only = client.chat.completions.create(model=model, max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    assert only.choices[0].finish_reason in ("length", "stop") and only.usage.prompt_tokens > 13 * 16
