"""The chaos campaign's tests reach the test machines (SSH hosts) of ``tests/multiproc``, and
the Ray cluster of ``tests/ray`` (whose style runs in the Ray lane)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multiproc"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ray"))
