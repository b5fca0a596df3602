"""A full ``/dev/shm``: the kernel's own (a small tmpfs in a mount namespace of its own, as a
container's), filled to the brim before the launch. Big values still travel both ways (the
launch's folder goes to the temporary folder, its segments inline or there), and a
``max_restarts`` run, whose agent needs room there for its workers' queues, says so before
any worker starts, with an error that holds none of the agent's frames (its stores and their
connections would stay open for as long as the notebook keeps the error). Nothing is left in
either folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import system_features

pytestmark = pytest.mark.timeout(180)

#: The size of the kernel's own ``/dev/shm``.
SHM_MB = 16

KERNEL = """
import json, os, sys
import torch
from nb_accel import notebook_launcher
from nb_accel.errors import LaunchError

def doubled(big):
    import torch.distributed as dist
    return dist.get_rank(), big * 2  # a big value back too

fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
try:
    while True:
        os.write(fd, bytes(1 << 16))
except OSError:  # full
    pass
finally:
    os.close(fd)
outcome = {}
results = notebook_launcher(
    doubled, (torch.ones(1 << 20),), num_processes=2, cpu=True, start_method=sys.argv[1]
)
outcome["results"] = [[rank, bool(value.eq(2).all()), value.numel()] for rank, value in results]
try:
    notebook_launcher(doubled, (torch.ones(8),), num_processes=2, cpu=True, max_restarts=1)
except LaunchError as error:
    outcome["restarts"] = str(error)
    outcome["frames kept"] = error.__context__ is not None or error.__cause__ is not None
outcome["/dev/shm"] = sorted(os.listdir("/dev/shm"))
print("OUTCOME", json.dumps(outcome))
"""


def _in_a_small_shm(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` run with a ``/dev/shm`` of its own, :data:`SHM_MB` MB big."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        system_features.unavailable("needs root and unshare for a /dev/shm of its own")
    mount = f'mount -t tmpfs -o size={SHM_MB}m nb-shm /dev/shm && exec "$@"'
    wrapped = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh"]
    return subprocess.run(
        [*wrapped, *command], capture_output=True, text=True, timeout=150, env=env, check=False
    )


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_full_dev_shm_neither_stops_a_launch_nor_leaves_anything(
    tmp_path: Path, start_method: str
) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = _in_a_small_shm(
        [sys.executable, str(script), start_method], {**os.environ, "TMPDIR": str(scratch)}
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, done.stdout + done.stderr
    outcome = json.loads(lines[-1].removeprefix("OUTCOME "))
    assert outcome["results"] == [[0, True, 1 << 20], [1, True, 1 << 20]], done.stderr
    said = outcome["restarts"]
    assert "the elastic agent could not start the workers: [Errno 28]" in said, said
    assert f"queues need room in /dev/shm (0 MB free of {SHM_MB} MB)" in said, said
    assert not outcome["frames kept"]
    assert outcome["/dev/shm"] == ["filler"]  # nothing of the launches
    assert [p.name for p in scratch.iterdir() if p.name.startswith("nb_accel-")] == []
