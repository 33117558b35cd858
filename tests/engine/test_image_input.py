"""engine.vision.image_input on real files Pillow writes: every refusal names its problem."""
from __future__ import annotations

import asyncio
import base64
import io
import struct
import subprocess
import sys
import zlib

import pytest
from aiohttp import web
from PIL import Image

from engine.vision.image_input import (
    ImageError, ImageLimits, data_url, decode_data_url, decode_image, image_format, load_image_url,
)


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def huge_png(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of width x height, all zeros: a few kilobytes on disk, width*height pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    row = b"\0" * (1 + (width + 7) // 8)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_decodes_to_rgb(fmt):
    img = Image.new("RGB", (37, 21), (200, 30, 90))
    out = decode_image(encode(img, fmt))
    assert out.mode == "RGB" and out.size == (37, 21)
    r, g, b = out.getpixel((5, 5))
    assert abs(r - 200) < 12 and abs(g - 30) < 12 and abs(b - 90) < 12  # lossy formats stay close


def test_transparency_is_white_not_black():
    img = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    assert decode_image(encode(img, "PNG")).getpixel((0, 0)) == (255, 255, 255)


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 10), (0, 0, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees when shown
    out = decode_image(encode(img, "JPEG", exif=exif.tobytes()))
    assert out.size == (10, 40)


def test_corrupt_and_truncated_bytes():
    with pytest.raises(ImageError, match="not an image"):
        decode_image(b"this is text, not a PNG" * 10)
    good = encode(Image.effect_noise((300, 300), 60).convert("RGB"), "PNG")
    with pytest.raises(ImageError, match="corrupt or truncated"):
        decode_image(good[: len(good) // 2])
    with pytest.raises(ImageError, match="empty"):
        decode_image(b"")


def test_unsupported_format_is_named():
    with pytest.raises(ImageError, match="unsupported image format TIFF"):
        decode_image(encode(Image.new("RGB", (4, 4)), "TIFF"))
    with pytest.raises(ImageError, match="unsupported image format BMP"):
        decode_image(encode(Image.new("RGB", (4, 4)), "BMP"))


def test_byte_limit():
    data = encode(Image.effect_noise((200, 200), 90).convert("RGB"), "PNG")
    with pytest.raises(ImageError, match="over the 0.0 MiB limit"):
        decode_image(data, max_bytes=1000)
    assert decode_image(data, max_bytes=len(data)).size == (200, 200)


def test_pixel_limit_is_per_call():
    data = encode(Image.new("RGB", (100, 50)), "PNG")
    with pytest.raises(ImageError, match="100x50 = 5,000 pixels, over the limit of 4,999"):
        decode_image(data, max_pixels=4999)
    assert decode_image(data, max_pixels=5000).size == (100, 50)


@pytest.mark.parametrize("side", [20000, 9000])
def test_huge_png_refused_from_its_header_in_bounded_memory(tmp_path, side):
    """A 400-megapixel PNG (a full RGB decode would take 1.2 GB) and an 81-megapixel one (under Pillow's own
    bomb limit, over ours) are refused from their headers: a child process that tries stays far under that."""
    path = tmp_path / "bomb.png"
    path.write_bytes(huge_png(side, side))
    assert path.stat().st_size < 200_000
    script = (
                "from engine.vision.image_input import decode_image, ImageError\n"
        f"data = open({str(path)!r}, 'rb').read()\n"
        "try:\n    decode_image(data)\nexcept ImageError as e:\n    print('refused:', e)\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print('peak_mib', int(hwm) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True).stdout
    expected = ("the image has too many pixels: Image size (400000000 pixels)" if side == 20000 else
                "the image is 9000x9000 = 81,000,000 pixels, over the limit of 40,000,000")
    assert "refused: " + expected in out, out
    peak = int(out.split("peak_mib")[1])
    assert peak < 100, out  # (a full RGB decode of even the smaller one takes 243 MB)


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (16, 16), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert Image.open(io.BytesIO(buf.getvalue())).n_frames == 3
    out = decode_image(buf.getvalue())
    assert out.mode == "RGB" and out.getpixel((8, 8)) == (255, 0, 0)


def test_data_urls():
    data = encode(Image.new("RGB", (9, 7), (1, 2, 3)), "PNG")
    assert decode_data_url(data_url(data, "image/png")).size == (9, 7)
    with pytest.raises(ImageError, match="not base64"):
        decode_data_url("data:image/png,abc")
    with pytest.raises(ImageError, match="base64 is invalid"):
        decode_data_url("data:image/png;base64,@@@@")
    with pytest.raises(ImageError, match="holds text/plain, not an image"):
        decode_data_url("data:text/plain;base64," + base64.b64encode(b"hi").decode())
    with pytest.raises(ImageError, match="not a data: URL"):
        decode_data_url("http://example.com/a.png")


def test_huge_base64_refused_before_decoding():
    huge = "data:image/png;base64," + "A" * (40 * 2**20)
    with pytest.raises(ImageError, match="over the 20.0 MiB limit"):
        decode_data_url(huge)


def test_remote_urls_need_permission_and_keep_limits():
    png = encode(Image.new("RGB", (5, 5), (9, 9, 9)), "PNG")

    async def main():
        async def image(_r):
            return web.Response(body=png, content_type="image/png")

        async def big(_r):
            return web.Response(body=b"\0" * 5000, content_type="image/png")

        async def slow(_r):
            await asyncio.sleep(5)
            return web.Response(body=png)

        app = web.Application()
        app.router.add_get("/a.png", image)
        app.router.add_get("/big.png", big)
        app.router.add_get("/slow.png", slow)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            with pytest.raises(ImageError, match="--allow-remote-images"):
                await load_image_url(base + "/a.png")
            assert (await load_image_url(base + "/a.png", allow_remote=True)).size == (5, 5)
            with pytest.raises(ImageError, match="over the"):
                await load_image_url(base + "/big.png", allow_remote=True, limits=ImageLimits(max_bytes=1000))
            with pytest.raises(ImageError, match="took over 0.5 s"):
                await load_image_url(base + "/slow.png", allow_remote=True, limits=ImageLimits(fetch_timeout_s=0.5))
            with pytest.raises(ImageError, match="HTTP 404"):
                await load_image_url(base + "/missing.png", allow_remote=True)
            with pytest.raises(ImageError, match="scheme 'file'"):
                await load_image_url("file:///etc/passwd", allow_remote=True)
        finally:
            await runner.cleanup()

    asyncio.run(main())
