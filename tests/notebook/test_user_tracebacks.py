"""What a notebook user reads when something goes wrong: their frames and our message only."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_driver import CellRun, collect, run_cell, running_kernel, start_cell

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Modules whose frames a user must not see: ours and the kernel's plumbing.
PLUMBING = ("nb_accel", "traitlets", "ipywidgets", "comm", "ipykernel", "zmq", "IPython")

SETUP = """
import time
import torch.distributed as dist
from nb_accel import notebook_launcher, tqdm
"""

WORKER_FAILS = """
def train():
    if dist.get_rank() == 1:
        raise ValueError("label 7 is out of range")
    time.sleep(30)

notebook_launcher(train, num_processes=2)
"""

LIVE_BARS = """
def train():
    for step in tqdm(range(10_000), desc="steps"):
        if step == 5:
            print(f"rank {dist.get_rank()} running", flush=True)
        time.sleep(0.01)

notebook_launcher(train, num_processes=2)
"""


def _shown(run: CellRun) -> str:
    return ANSI.sub("", "\n".join(run.traceback))


def _internal_frames(text: str) -> list[str]:
    """The lines of ``text`` that show a frame of one of the hidden modules."""
    frames = [line for line in text.splitlines() if line.startswith(("File ", "  File "))]
    return [f for f in frames if any(f"/{name}/" in f for name in PLUMBING)]


def test_bad_input_shows_the_users_cell_and_the_message() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP)
        run = run_cell(client, "notebook_launcher(lambda: 1, num_processes=0)")
    text = _shown(run)
    assert run.ename == "ValueError" and "num_processes must be a positive int" in text
    assert _internal_frames(text) == [] and "launcher.py" not in text
    assert "----> 1 notebook_launcher(lambda: 1, num_processes=0)" in text
    assert len(text.splitlines()) <= 8, text


def test_a_worker_exception_shows_the_users_frames_and_its_worker_traceback() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, SETUP)
        run = run_cell(client, WORKER_FAILS)
    text = _shown(run)
    assert run.ename == "ValueError"
    assert 'raise ValueError("label 7 is out of range")' in text  # the worker-side cause
    assert re.search(r"Cell In\[\d+\], line 3, in train", text), text  # named as IPython does
    assert "notebook_launcher(train, num_processes=2)" in text  # the user's cell
    assert "Raised on rank 1 of 2" in text
    assert _internal_frames(text) == [] and "supervisor" not in text


def test_an_interrupt_during_a_live_launch_is_one_short_traceback() -> None:
    with running_kernel() as (manager, client):
        run_cell(client, SETUP)
        msg_id = start_cell(client, LIVE_BARS)
        collect(client, msg_id, until=("rank 0 running", "rank 1 running"))
        manager.interrupt_kernel()
        run = collect(client, msg_id)
    text = _shown(run)
    assert run.ename == "KeyboardInterrupt"
    assert _internal_frames(text) == []
    assert not any(name in text for name in ("traitlets", "ipywidgets", "zmq", "comm.py"))
    assert len(text.splitlines()) <= 15, text  # 3 of them: where each rank was
    assert "Interrupted while:\n  rank 0 was at `train` (Cell In[" in text, text


def test_a_distributed_cell_error_names_the_cell_and_suggests_push() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, "%load_ext nb_accel\nthreshold = 0.5")
        collect(client, client.execute("%%distributed -n 2\nx = 1", store_history=True))
        msg_id = client.execute("%%distributed\ny = 2\nprint(y > threshold)", store_history=True)
        run = collect(client, msg_id)
        run_cell(client, "%distributed stop")
    text = _shown(run)
    assert run.ename == "NameError"
    assert re.search(r"Cell In\[\d+\], line 3, in <module>", text), text  # as the notebook
    assert "<cell" not in text
    assert "`threshold` is defined in the kernel" in text
    assert "%distributed push threshold" in text
    assert _internal_frames(text) == [] and "magics.py" not in text and "pool.py" not in text


def test_a_bad_option_of_the_cell_magic_is_its_message_only() -> None:
    with running_kernel() as (_manager, client):
        run_cell(client, "%load_ext nb_accel")
        run = run_cell(client, "%%distributed -n 0\nx = 1")
    text = _shown(run)
    assert run.ename == "ValueError" and "num_processes must be a positive int" in text
    assert _internal_frames(text) == [] and "magics.py" not in text and "plan.py" not in text
    assert len(text.splitlines()) <= 4, text


@pytest.mark.parametrize("entry_point", ["notebook_launcher", "debug_launcher"])
def test_a_script_sees_its_own_frame_and_the_entry_point(tmp_path: Path, entry_point: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        f"from nb_accel import {entry_point}\n\n{entry_point}(lambda: 1, num_processes=0)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    frames = [line for line in done.stderr.splitlines() if line.startswith("  File ")]
    assert len(frames) == 2, done.stderr  # the script's line, then the entry point's raise
    assert str(script) in frames[0] and f"in {entry_point}" in frames[1]
    assert done.stderr.rstrip().endswith("num_processes must be a positive int (1 or more), got 0")


def test_a_script_sees_the_worker_side_cause_and_its_own_frame(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from nb_accel import debug_launcher\n\n"
        "def train():\n"
        "    raise ValueError('label 7 is out of range')\n\n"
        "debug_launcher(train)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    cause, _, raised = done.stderr.partition("direct cause of the following exception")
    assert f'File "{script}", line 4, in train' in cause  # the worker side: the user's frame
    frames = [line for line in raised.splitlines() if line.startswith("  File ")]
    assert len(frames) == 2 and "in debug_launcher" in frames[1], done.stderr
    assert "ValueError: label 7 is out of range" in raised and "Raised on ranks 0, 1" in raised
