"""A stuck rank is flagged as stalled, a finished one never, in real 2-process launches.

Rank 0 finishes its bar and returns at once. Rank 1 reaches 2/100 and then only redraws its
bar (as tqdm's monitor thread does every 10 s) until the test has seen it flagged, or for a
minute at most. The stall threshold is set to 1 s through ``$NB_ACCEL_STALL_AFTER_S``. Nothing
is timed: the workers wait for files that the test writes when it sees what it waits for.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nb_accel
from nb_accel.launch.views.stall import STALL_AFTER_ENV
from nb_accel.launch.views.view import register_view_factory, view_factory
from nb_accel.notebook.compat_widgets import text_of, tooltip_of
from nb_accel.notebook.progress_widget import ProgressWidget

#: The longest a worker waits for the test (a bound against hanging, not a timing).
WAIT_S = 60.0


def stuck_after_two(folder: str) -> int:
    """Rank 0 finishes and returns; rank 1 stops at 2/100, redrawing, until ``seen`` exists."""
    accelerator = nb_accel.Accelerator()
    rank, where = accelerator.process_index, Path(folder)
    bar = nb_accel.tqdm(total=100, desc="train")
    if rank == 0:
        bar.update(100)
        bar.close()
        return 0
    deadline = time.monotonic() + WAIT_S
    while not (where / "rank0-returned").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    bar.update(2)
    bar.refresh()
    while not (where / "seen").exists() and time.monotonic() < deadline:
        bar.refresh()  # a redraw with the same count: no progress
        time.sleep(0.05)
    bar.update(98)
    bar.close()
    return 1


class WatchedWidget(ProgressWidget):
    """The notebook's widget, telling the workers (through files) when rank 0 has returned and
    when it has marked rank 1 stalled; it remembers every rank it ever marked."""

    def __init__(self, folder: Path, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.folder = folder
        self.marked: list[tuple[int, str]] = []
        self.stacks: list[str] = []  # what the stalled rows offer on hover

    def returned(self, rank: int) -> None:
        super().returned(rank)
        if rank == 0:
            (self.folder / "rank0-returned").touch()

    def tick(self) -> None:
        super().tick()
        for row in self.rows:
            if row.stalled_for is not None:
                self.marked.append((row.rank, text_of(row.note)))
                self.stacks.append(tooltip_of(row.note) or "")
        if any(rank == 1 for rank, _ in self.marked):
            (self.folder / "seen").touch()


def test_the_widget_flags_the_stuck_rank_and_never_the_finished_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STALL_AFTER_ENV, "1")
    views: list[WatchedWidget] = []

    def factory(title: str, world_size: int, all_ranks: bool, **kwargs: int) -> WatchedWidget:
        views.append(WatchedWidget(tmp_path, title, world_size, all_ranks, **kwargs))
        return views[-1]

    previous = view_factory()
    register_view_factory(factory)
    try:
        assert nb_accel.notebook_launcher(stuck_after_two, (str(tmp_path),), num_processes=2) == [
            0,
            1,
        ]
    finally:
        register_view_factory(previous)
    (view,) = views
    assert view.stall_after_s == 1.0
    assert (tmp_path / "seen").exists(), "rank 1 was never marked stalled"
    assert {rank for rank, _ in view.marked} == {1}, view.marked
    assert all(note.startswith("stalled for ") for _, note in view.marked)
    assert ", at `stuck_after_two` (test_stalled_ranks.py, line " in view.marked[0][1]  # where
    assert "main thread:" in view.stacks[0] and ", in stuck_after_two" in view.stacks[0]
    assert [row.bar.bar_style for row in view.rows] == ["success", "success"]


SCRIPT = """
import time
from pathlib import Path

import nb_accel

WAIT_S = {wait}

{function}

print("results", nb_accel.notebook_launcher(stuck_after_two, ({folder!r},), num_processes=2))
"""


def test_the_text_view_prints_a_line_for_the_stuck_rank_only(tmp_path: Path) -> None:
    script = tmp_path / "stuck.py"
    function = inspect.getsource(stuck_after_two)
    script.write_text(SCRIPT.format(wait=WAIT_S, function=function, folder=str(tmp_path)))
    env = {**os.environ, STALL_AFTER_ENV: "1"}
    lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as launch:
        try:
            assert launch.stderr is not None and launch.stdout is not None
            for line in launch.stderr:
                lines.append(line.rstrip("\n"))
                if "rank 1 has made no progress" in line:
                    (tmp_path / "seen").touch()
                if line.startswith("train:") and "100/100" in line:
                    (tmp_path / "rank0-returned").touch()  # rank 0's final bar
            stdout = launch.stdout.read()
            assert launch.wait(timeout=WAIT_S) == 0, lines
        finally:
            if launch.poll() is None:
                launch.kill()
                launch.wait()
    assert "results [0, 1]" in stdout
    stalled = [line for line in lines if "made no progress" in line]
    assert len(stalled) == 1 and stalled[0].startswith("rank 1 has made no progress for "), lines
    assert ", at `stuck_after_two` (" in stalled[0], stalled  # where it was
    assert "rank 1 is making progress again" in lines
