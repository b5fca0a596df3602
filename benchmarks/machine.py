"""The first line of every benchmark's output: when, on what, with which versions."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone

__all__ = ["run_header"]


def run_header(**versions: str) -> str:
    """``"<UTC time>; <n> CPU cores; Python <v>, name <v>, ..."`` for ``versions``."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    listed = "".join(f", {name} {version}" for name, version in versions.items())
    return f"{stamp}; {os.cpu_count()} CPU cores; Python {platform.python_version()}{listed}"
