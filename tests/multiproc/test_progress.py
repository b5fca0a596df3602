"""nb_accel.tqdm and accelerator.log from launched workers, seen outside a notebook."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tqdm as tqdm_module

import nb_accel
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory

SCRIPT = textwrap.dedent(
    """
    from nb_accel import Accelerator, notebook_launcher, tqdm

    def train(fail):
        accelerator = Accelerator()
        for i in tqdm(range(50), desc="train"):
            accelerator.log({"loss": 1.0 / (i + 1)})
            if fail and i == 20 and accelerator.process_index == 1:
                raise ValueError("bad batch on rank 1")
        return accelerator.process_index

    print("results", notebook_launcher(train, args=(False,), num_processes=2))
    try:
        notebook_launcher(train, args=(True,), num_processes=2)
    except ValueError as error:
        print("caught", error)
    """
)


def test_the_text_view_shows_rank_0_s_bar_and_failures(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    )
    assert "results [0, 1]" in done.stdout and "caught bad batch on rank 1" in done.stdout
    lines = done.stderr.splitlines()
    assert any(line.startswith("train: 100%") and "50/50" in line for line in lines)
    assert any("loss=0.02" in line for line in lines)  # rank 0's latest metric after the bar
    assert "rank 1 failed: ValueError: bad batch on rank 1" in lines
    assert "ipywidgets" not in done.stderr


class Recorder(NullView):
    """A launch view that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, event: Report) -> None:
        """Keep it."""
        self.reports.append(event)


def nested_bars() -> int:
    accelerator = nb_accel.Accelerator()
    for epoch in nb_accel.tqdm(range(2), desc="epochs"):
        bar = nb_accel.tqdm(total=30_000, desc="batches", unit="batch", leave=False)
        for i in range(30_000):
            bar.update(1)
            if i % 10_000 == 0:
                bar.set_postfix(loss=1.0 / (i + 1))
                accelerator.log({"loss": float(i)}, step=epoch * 30_000 + i)
        bar.close()
    return accelerator.process_index


def test_bars_nest_coalesce_and_end_in_their_final_state() -> None:
    recorder = Recorder()
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: recorder)
    try:
        assert nb_accel.notebook_launcher(nested_bars, num_processes=2) == [0, 1]
    finally:
        register_view_factory(previous)
    for rank in (0, 1):
        mine = [r for r in recorder.reports if r.rank == rank]
        bars = [b for r in mine for b in r.bars]
        outer = [b for b in bars if b.desc == "epochs"]
        inner = [b for b in bars if b.desc == "batches"]
        assert outer[-1].n == 2 and outer[-1].closed and outer[-1].level == 0
        assert inner[-1].n == 30_000 and inner[-1].closed and not inner[-1].leave
        assert all(b.level == 1 for b in inner) and inner[-1].unit == "batch"
        assert any(b.postfix.startswith("loss=") for b in inner)
        points = [p for r in mine for p in r.metrics]
        assert [step for step, _ in points] == [0, 10_000, 20_000, 30_000, 40_000, 50_000]
        assert len(mine) < 60_000 / 1000  # coalesced: far fewer reports than updates


def test_outside_a_launch_it_is_tqdm_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tqdm_module.std.tqdm, "monitor_interval", 0)  # no tqdm monitor thread
    bar = nb_accel.tqdm(range(3), disable=True)
    assert isinstance(bar, tqdm_module.tqdm)
    assert type(bar) is tqdm_module.auto.tqdm
    assert list(bar) == [0, 1, 2]
