"""Image bytes -> a checked RGB PIL image: the one gate every image passes (server requests, app attachments).

Torch-free (Pillow only), so the app decodes its attachments with the same limits the server applies.
What is refused, each with an ImageError naming the problem:

- more bytes than `max_bytes` (a base64 string is measured before it is decoded);
- bytes that are not an image, or a format other than PNG, JPEG, WEBP and GIF (OpenAI's list);
- more pixels than `max_pixels`: the size comes from the file's header, read before any pixel is
  decoded, so a 20000x20000 PNG of a few kilobytes is refused in bounded memory. Pillow's own
  decompression-bomb limit (Image.MAX_IMAGE_PIXELS) is a process-wide global that a per-request value
  can't safely change from several threads, so the per-call limit is checked here, before load();
- a file whose pixel data is truncated or corrupt (found while decoding).

An animated GIF (or WEBP/APNG) gives its first frame, as vLLM does (its media loader opens the image and
converts it, which reads frame 0); OpenAI's documentation asks for non-animated GIFs, and a still frame
is the only thing an image model reads, so refusing would only break requests that work on vLLM.
Transparency is composited on white (vLLM's rgba_to_rgb default) rather than dropped to black, and a
JPEG's EXIF orientation is applied, so a phone photo is the right way up.
Remote http(s) URLs are fetched only where the caller allows it (`engine serve --allow-remote-images`),
with a byte limit and a time limit.
"""
from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

DEFAULT_MAX_BYTES = 20 * 2**20  # one image's encoded size (OpenAI's per-image limit is 20 MB)
DEFAULT_MAX_PIXELS = 40_000_000  # e.g. 8000x5000; far above any vision encoder's input, far below a bomb
DEFAULT_FETCH_TIMEOUT_S = 10.0
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+(=[\w.+-]+)?)*),", re.ASCII)


class ImageError(ValueError):
    """An image that can't be used; the message says what is wrong with it."""


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def image_format(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[str, int, int]:
    """(format, width, height) from the header alone, after the byte, format and pixel checks."""
    img = _open(data, max_bytes, max_pixels)
    with img:
        return img.format, img.width, img.height


def _open(data: bytes, max_bytes: int, max_pixels: int) -> Image.Image:
    if len(data) > max_bytes:
        raise ImageError(f"the image is {_mib(len(data))}, over the {_mib(max_bytes)} limit")
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data))  # reads the header only
    except UnidentifiedImageError:
        raise ImageError("the data is not an image (corrupt bytes or an unknown format; use PNG, JPEG, WEBP "
                         "or GIF)") from None
    except Image.DecompressionBombError as exc:
        raise ImageError(f"the image has too many pixels: {exc}") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"the image is corrupt: {exc}") from None
    if img.format not in FORMATS:
        fmt = img.format
        img.close()
        raise ImageError(f"unsupported image format {fmt} (use PNG, JPEG, WEBP or GIF)")
    if img.width * img.height > max_pixels:
        w, h = img.size
        img.close()
        raise ImageError(f"the image is {w}x{h} = {w * h:,} pixels, over the limit of {max_pixels:,} "
                         "(scale it down first)")
    if img.width < 1 or img.height < 1:
        img.close()
        raise ImageError(f"the image has no pixels ({img.width}x{img.height})")
    return img


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> Image.Image:
    """Checked bytes -> RGB image (first frame of an animation, EXIF-rotated, transparency on white)."""
    img = _open(data, max_bytes, max_pixels)
    try:
        img.seek(0)
        img.load()
        img = ImageOps.exif_transpose(img) or img
        return _rgb(img)
    except Image.DecompressionBombError as exc:
        raise ImageError(f"the image has too many pixels: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # truncated or damaged pixel data
        raise ImageError(f"the image data is corrupt or truncated ({img.format}): {exc}") from None
    finally:
        img.close()


def _rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img.copy()
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        out = Image.new("RGB", rgba.size, (255, 255, 255))
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return img.convert("RGB")


def data_url_bytes(url: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str | None, bytes]:
    """(mime, bytes) of a base64 data: URL; its length is checked against max_bytes before decoding."""
    m = _DATA_URL.match(url)
    if m is None:
        raise ImageError("not a data: URL (expected data:image/png;base64,...)")
    if ";base64" not in (m.group("params") or ""):
        raise ImageError("the data: URL is not base64-encoded (expected data:image/...;base64,...)")
    mime = m.group("mime")
    if mime is not None and not mime.startswith("image/"):
        raise ImageError(f"the data: URL holds {mime}, not an image")
    payload = url[m.end():]
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise ImageError(f"the base64 image is {_mib(len(payload) * 3 / 4)}, over the {_mib(max_bytes)} limit")
    try:
        data = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"the data: URL's base64 is invalid: {exc}") from None
    return mime, data


def decode_data_url(url: str, *, max_pixels: int = DEFAULT_MAX_PIXELS,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> Image.Image:
    """A data:image/...;base64,... URL -> RGB image, with decode_image's checks."""
    return decode_image(data_url_bytes(url, max_bytes=max_bytes)[1], max_pixels=max_pixels, max_bytes=max_bytes)


def data_url(data: bytes, mime: str) -> str:
    """The data: URL that carries `data` (what the app sends a server)."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


async def fetch_image_bytes(url: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                            timeout_s: float = DEFAULT_FETCH_TIMEOUT_S) -> bytes:
    """GET an http(s) image within a byte limit (Content-Length checked first, the body counted as it
    arrives) and a total time limit."""
    import asyncio

    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url, allow_redirects=True, max_redirects=3) as resp:
                if resp.status != 200:
                    raise ImageError(f"fetching the image at {url} answered HTTP {resp.status}")
                if resp.content_length is not None and resp.content_length > max_bytes:
                    raise ImageError(f"the image at {url} is {_mib(resp.content_length)}, over the "
                                     f"{_mib(max_bytes)} limit")
                out = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    out += chunk
                    if len(out) > max_bytes:
                        raise ImageError(f"the image at {url} is over the {_mib(max_bytes)} limit")
                return bytes(out)
    except asyncio.TimeoutError:
        raise ImageError(f"fetching the image at {url} took over {timeout_s:g} s") from None
    except aiohttp.ClientError as exc:
        raise ImageError(f"cannot fetch the image at {url}: {exc}") from None


async def load_image_url(url: str, *, allow_remote: bool = False, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """An OpenAI image_url's url -> RGB image: a data: URL, or http(s) where allow_remote; decoding runs in
    a worker thread so a large image never stalls the event loop."""
    import asyncio

    if not isinstance(url, str) or not url:
        raise ImageError("image_url.url must be a non-empty string")
    if url.startswith("data:"):
        return await asyncio.to_thread(decode_data_url, url, max_pixels=limits.max_pixels,
                                       max_bytes=limits.max_bytes)
    scheme = url.partition(":")[0].lower()
    if scheme in ("http", "https"):
        if not allow_remote:
            raise ImageError("remote image URLs are off on this server: send the image as a data: URL "
                             "(data:image/png;base64,...), or start the server with --allow-remote-images")
        data = await fetch_image_bytes(url, max_bytes=limits.max_bytes, timeout_s=limits.fetch_timeout_s)
        return await asyncio.to_thread(decode_image, data, max_pixels=limits.max_pixels, max_bytes=limits.max_bytes)
    raise ImageError(f"unsupported image URL scheme {scheme!r}: use a data: URL or http(s)")
