"""A rank that fails only because another went away is shown as stopped, never as the cause."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from markers import process_ended, wait_for_files, wait_until
from shown_rows import ShownRows

from nb_accel import notebook_launcher
from nb_accel.launch.views.view import register_view_factory, view_factory


@pytest.fixture
def view() -> Iterator[ShownRows]:
    recorder = ShownRows()
    previous = view_factory()
    register_view_factory(lambda *args, **kwargs: recorder)
    try:
        yield recorder
    finally:
        register_view_factory(previous)


def rank_one_has_a_typo(folder: str) -> int:
    """Rank 1 fails once every other rank is inside the all-reduce: it has issued it (which
    cannot complete without rank 1) and written its marker before waiting for it."""
    rank, others = dist.get_rank(), [r for r in range(dist.get_world_size()) if r != 1]
    if rank == 1:
        wait_for_files(*(Path(folder, f"rank{r}-in-all-reduce") for r in others))
        undefined_name  # type: ignore[name-defined]  # noqa: B018, F821
    work = dist.all_reduce(torch.ones(1), async_op=True)
    Path(folder, f"rank{rank}-in-all-reduce").touch()
    work.wait()
    return rank


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_cause_is_raised_and_the_others_are_shown_stopped(
    view: ShownRows, world_size: int, tmp_path: Path
) -> None:
    with pytest.raises(NameError, match="undefined_name") as info:
        notebook_launcher(
            rank_one_has_a_typo, args=(str(tmp_path),), num_processes=world_size, cpu=True
        )
    notes = "\n".join(info.value.__notes__)
    others = [r for r in range(world_size) if r != 1]
    assert f"Raised on rank 1 of {world_size}" in notes
    stopped = "Rank 0 was" if world_size == 2 else "Ranks 0, 2 were"
    assert f"{stopped} stopped by this failure." in notes
    assert "Other failures" not in notes
    assert "Connection" not in notes and "GLHF" not in notes  # gloo's text is not shown
    assert view.rows[1] == ("failed", "NameError: name 'undefined_name' is not defined")
    for rank in others:
        assert view.rows[rank] == ("stopped", "rank 1 failed")


def lost_connection_reaches_the_kernel_first() -> None:
    """Rank 0 reports what gloo raises on a rank whose peer went away, and exits; only then
    (its report is on its way to the kernel: a worker exits after sending it) rank 1 raises
    the cause."""
    pids: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    if dist.get_rank() == 0:
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:34724. GLHF!")
    rank0 = pids[0]
    assert rank0 is not None
    wait_until(lambda: process_ended(rank0), "rank 0's exit")
    raise ValueError("sample 13 is corrupt")


def test_the_cause_wins_when_a_lost_connection_arrives_before_it(view: ShownRows) -> None:
    with pytest.raises(ValueError, match="sample 13 is corrupt") as info:
        notebook_launcher(lost_connection_reaches_the_kernel_first, num_processes=2, cpu=True)
    notes = "\n".join(info.value.__notes__)
    assert "Rank 0 was stopped by this failure." in notes and "GLHF" not in notes
    assert view.rows == {
        1: ("failed", "ValueError: sample 13 is corrupt"),
        0: ("stopped", "rank 1 failed"),
    }
