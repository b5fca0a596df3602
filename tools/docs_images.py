"""Copy the screenshots the documentation shows from the browser lane's output to docs/images/.

Usage: python tools/docs_images.py [--source build/browser] [--dest docs/images]

``make screenshots`` runs the browser lane (the notebooks in JupyterLab in headless Chromium),
then this: each picture is an element screenshot taken by a test, saved as a smaller PNG (with
Pillow: optimised, and reduced to a 256-colour palette when it is still over the size limit).
Exits non-zero when a screenshot is missing or cannot be made small enough.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
#: The documentation's picture: the browser test's screenshot it comes from.
IMAGES = {
    "live-view.png": "quickstart-progress.png",
    "failure-view.png": "quickstart-failure-view.png",
    "config-form.png": "config_widget-fields.png",
    "distributed-magic.png": "cell_magic-all-ranks.png",
}
#: The largest picture kept in the repository (bytes).
MAX_BYTES = 250_000


def small_png(source: Path) -> bytes:
    """``source`` as an optimised PNG: lossless when that is under :data:`MAX_BYTES`, else with
    a 256-colour palette."""
    from PIL import Image

    with Image.open(source) as image:
        image.load()
    rgb = image.convert("RGB")
    lossless = _png(rgb)
    if len(lossless) <= MAX_BYTES:
        return lossless
    return _png(rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT))


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def main() -> int:
    """Write every picture of :data:`IMAGES`; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=ROOT / "build" / "browser")
    parser.add_argument("--dest", type=Path, default=ROOT / "docs" / "images")
    options = parser.parse_args()
    missing = [shot for shot in IMAGES.values() if not (options.source / shot).is_file()]
    if missing:
        print(f"not in {options.source}: {', '.join(missing)} (did the browser tests pass?)")
        return 1
    options.dest.mkdir(parents=True, exist_ok=True)
    failed = False
    for name, shot in IMAGES.items():
        data = small_png(options.source / shot)
        if len(data) > MAX_BYTES:
            print(f"{name}: {len(data)} bytes, over {MAX_BYTES}")
            failed = True
            continue
        (options.dest / name).write_bytes(data)
        print(f"{name}: {len(data) // 1000} kB, from {shot}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
