"""The documentation's pictures are there and are PNG files of a sensible size: every one that
``make screenshots`` writes (tools/docs_images.py), every one a page under docs/ shows, and every
file in docs/images/. What they show is the browser lane's business, not this test's."""

from __future__ import annotations

import importlib.util
import re
import struct
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
IMAGES = DOCS / "images"
_spec = importlib.util.spec_from_file_location("docs_images", ROOT / "tools" / "docs_images.py")
assert _spec is not None and _spec.loader is not None
docs_images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_images)

SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: A picture's width and height in pixels: an element, not an icon, not a poster.
SIDE_PX = (50, 4000)
#: A picture reached from a page: Markdown's ``![text](path)`` or HTML's ``src="path"``.
REFERENCE = re.compile(r"""(?:!\[[^\]]*\]\(\s*<?|\bsrc=["'])([^)"'\s>]+\.png)""", re.IGNORECASE)


def png_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of a PNG file's bytes; ``ValueError`` when they are not one: the
    signature, then an intact IHDR chunk (length, CRC, a colour type and bit depth PNG allows),
    and an IEND chunk at the end."""
    if not data.startswith(SIGNATURE):
        raise ValueError("no PNG signature")
    length, kind = struct.unpack(">I4s", data[8:16])
    if kind != b"IHDR" or length != 13:
        raise ValueError(f"the first chunk is {kind!r} of {length} bytes, not IHDR's 13")
    header = data[16:29]
    (crc,) = struct.unpack(">I", data[29:33])
    if zlib.crc32(kind + header) != crc:
        raise ValueError("IHDR's CRC does not match")
    width, height, depth, colour, _compression, _filter, _interlace = struct.unpack(
        ">IIBBBBB", header
    )
    allowed = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
    if depth not in allowed.get(colour, ()):
        raise ValueError(f"colour type {colour} with bit depth {depth}")
    if data[-12:] != struct.pack(">I4sI", 0, b"IEND", zlib.crc32(b"IEND")):
        raise ValueError("no IEND chunk at the end (cut short?)")
    return width, height


def referenced() -> set[Path]:
    """The local PNG files the pages under docs/ show."""
    found = set()
    for page in [*DOCS.rglob("*.md"), *DOCS.rglob("*.html")]:
        for target in REFERENCE.findall(page.read_text(encoding="utf-8")):
            if "://" not in target:
                found.add((page.parent / target.split("#")[0]).resolve())
    return found


def all_pictures() -> list[Path]:
    """The pictures to check: written by ``make screenshots``, shown by a page, or in
    docs/images/."""
    written = {(IMAGES / name).resolve() for name in docs_images.IMAGES}
    present = {path.resolve() for path in IMAGES.glob("*.png")}
    return sorted(written | referenced() | present)


@pytest.mark.timeout(30)
def test_every_screenshot_the_docs_use_is_there() -> None:
    pictures = all_pictures()
    assert {(IMAGES / name).resolve() for name in docs_images.IMAGES} <= set(pictures)
    missing = [str(path.relative_to(ROOT)) for path in pictures if not path.is_file()]
    assert not missing, f"missing (make screenshots writes docs/images/): {missing}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("picture", all_pictures(), ids=lambda path: path.name)
def test_each_picture_is_a_png_of_a_sensible_size(picture: Path) -> None:
    if not picture.is_file():
        pytest.fail(f"{picture.relative_to(ROOT)} is missing")
    data = picture.read_bytes()
    assert len(data) <= docs_images.MAX_BYTES, f"{len(data)} bytes"
    width, height = png_size(data)
    low, high = SIDE_PX
    assert low <= width <= high and low <= height <= high, (width, height)


@pytest.mark.timeout(30)
def test_the_check_tells_a_png_from_a_broken_one() -> None:
    row = b"\x00" + b"\xff\xff\xff" * 60
    ihdr = struct.pack(">IIBBBBB", 60, 60, 8, 2, 0, 0, 0)
    idat = zlib.compress(row * 60)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    good = SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    assert png_size(good) == (60, 60)
    broken = {
        "no PNG signature": b"GIF89a" + good[6:],
        "no IEND": good[:-12],
        "CRC does not match": good[:20] + b"\x07" + good[21:],
    }
    for why, data in broken.items():
        with pytest.raises(ValueError, match=why):
            png_size(data)
