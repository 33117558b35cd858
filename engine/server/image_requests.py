"""A chat request's images: OpenAI `image_url` content parts checked, fetched and decoded before parsing.

An image part is `{"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail":
"auto"|"low"|"high"}}` in a user message (OpenAI's shape; vLLM and llama-server take the same). This runs
before requests.parse_request, on the event loop: a request whose model reads text only is refused at
once with a 400 saying so (nothing decoded); otherwise every image is decoded in a worker thread
(engine.vision.image_input: byte, pixel and format limits; http(s) URLs only with
`--allow-remote-images`), so a bad or huge image is this request's 400 and other requests keep running.
The decoded images go to parse_request keyed by (message index, part index). `detail` is checked and
accepted as vLLM accepts it: the model's own image processor decides the resolution it reads.
"""
from __future__ import annotations

from typing import Any

from ..vision.image_input import ImageError, ImageLimits, load_image_url
from .errors import bad_request

DETAILS = ("auto", "low", "high")
Images = dict[tuple[int, int], Any]  # (message index, part index) -> PIL.Image.Image (RGB)


def image_parts(body: dict) -> list[tuple[int, int, Any]]:
    """(message index, part index, the part) of every image_url part, as sent."""
    messages = body.get("messages")
    out = []
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        content = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") == "image_url":
                out.append((i, j, part))
    return out


def image_url(body: dict, i: int, j: int, part: dict) -> str:
    """An image part's url, after the checks of its shape and place (400s naming the part)."""
    where = f"messages[{i}].content[{j}]"
    role = body["messages"][i].get("role")
    if role != "user":
        raise bad_request(f"{where}: images go in user messages only (this is a {role!r} message)", where)
    spec = part.get("image_url")
    if set(part) - {"type", "image_url"} or not isinstance(spec, dict) or not isinstance(spec.get("url"), str) \
            or set(spec) - {"url", "detail"}:
        raise bad_request(f"{where}.image_url must be an object {{\"url\": ..., \"detail\": ...}} with a "
                          "string url", f"{where}.image_url")
    if spec.get("detail", "auto") not in DETAILS:
        raise bad_request(f"{where}.image_url.detail must be auto, low or high, got {spec['detail']!r}",
                          f"{where}.image_url.detail")
    return spec["url"]


def cannot_see_images(model_name: str, where: str):
    return bad_request(f"this model cannot see images: {model_name} reads text only ({where} is an image). Send "
                       "the message without images, or serve a model that has a vision projector (an mmproj "
                       "file beside the GGUF).", where, "model_cannot_see_images")


async def load_request_images(body: Any, served: Any, *, allow_remote: bool = False,
                              limits: ImageLimits = ImageLimits()) -> Images:
    """Every image of a chat body, decoded; {} when it has none. 400 when the model cannot see images or
    an image is bad (corrupt, too big, an unsupported format, a remote URL not allowed or not fetched)."""
    if not isinstance(body, dict):
        return {}
    parts = image_parts(body)
    if not parts:
        return {}
    if not getattr(served, "can_see_images", False):
        i, j, _ = parts[0]
        raise cannot_see_images(served.name, f"messages[{i}].content[{j}]")
    images: Images = {}
    for i, j, part in parts:
        url = image_url(body, i, j, part)
        try:
            images[(i, j)] = await load_image_url(url, allow_remote=allow_remote, limits=limits)
        except ImageError as exc:
            where = f"messages[{i}].content[{j}].image_url"
            raise bad_request(f"{where}: {exc}", where, "invalid_image") from None
    return images
