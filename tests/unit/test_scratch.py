"""Scratch folders of launches: a killed kernel's folders are removed by the next launch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from nb_accel.launch.scratch import make_scratch_dir
from nb_accel.worker.transfer.segments import shared_root


def test_folders_of_kernels_that_are_gone_are_swept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    root = Path(shared_root())
    orphan = root / f"nb_accel-pool-{dead.stdout.strip()}-abc123"
    orphan.mkdir()
    (orphan / "store").write_text("left by a killed kernel")
    mine = Path(make_scratch_dir("launch"))
    try:
        assert not orphan.exists()
        assert mine.exists() and mine.name.startswith("nb_accel-launch-")
        kept = Path(make_scratch_dir("pool"))  # this process's own folders stay
        assert mine.exists() and kept.exists()
        shutil.rmtree(kept)
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(orphan, ignore_errors=True)
