"""Checkpoint folders appear whole or not at all; numbering continues past what is on disk; only
checkpoints older than the one just written are pruned; leftovers are removed."""

from __future__ import annotations

from pathlib import Path

from nb_accel.runtime.checkpoint.folders import (
    checkpoint_number,
    commit,
    make_staging,
    next_checkpoint_number,
    numbered_checkpoints,
    prune,
)


def _fill(folder: Path, text: str) -> None:
    (folder / "weights.txt").write_text(text)


def test_a_staged_folder_replaces_the_old_one_whole(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    first = make_staging(final)
    assert not final.exists() and first.name.startswith(".ckpt.partial-")
    _fill(first, "one")
    commit(first, final)
    assert (final / "weights.txt").read_text() == "one" and not first.exists()
    second = make_staging(final)
    _fill(second, "two")
    (final / "stale.txt").write_text("from the old checkpoint")
    commit(second, final)
    assert sorted(p.name for p in final.iterdir()) == ["weights.txt"]
    assert (final / "weights.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # nothing left behind


def test_leftovers_of_an_interrupted_save_are_removed_by_the_next(tmp_path: Path) -> None:
    final = tmp_path / "checkpoint_1"
    crashed = make_staging(final)
    _fill(crashed, "half")
    other = make_staging(tmp_path / "checkpoint_2")  # another checkpoint's: kept
    fresh = make_staging(final)
    assert not crashed.exists() and fresh.exists() and other.exists()
    assert numbered_checkpoints(tmp_path) == []  # staging folders never count as checkpoints


def test_numbering_and_pruning(tmp_path: Path) -> None:
    for n in (10, 2, 9, 1):
        (tmp_path / f"checkpoint_{n}").mkdir()
    (tmp_path / "checkpoint_x").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert [checkpoint_number(p) for p in numbered_checkpoints(tmp_path)] == [1, 2, 9, 10]
    removed = prune(tmp_path, keep=2, newest=10)
    assert [p.name for p in removed] == ["checkpoint_1", "checkpoint_2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint_10",
        "checkpoint_9",
        "checkpoint_x",
        "notes.txt",
    ]
    assert checkpoint_number("checkpoint_07") == 7 and checkpoint_number("ckpt_1") is None


def test_the_next_number_continues_past_the_checkpoints_on_disk(tmp_path: Path) -> None:
    assert next_checkpoint_number(tmp_path / "missing") == 0
    assert next_checkpoint_number(tmp_path / "missing", at_least=4) == 4
    for n in (0, 1, 2):
        (tmp_path / f"checkpoint_{n}").mkdir()
    make_staging(tmp_path / "checkpoint_7")  # an interrupted save is not a checkpoint
    assert next_checkpoint_number(tmp_path) == 3  # a new run: past the last run's checkpoints
    assert next_checkpoint_number(tmp_path, at_least=1) == 3  # resumed from checkpoint_0
    assert next_checkpoint_number(tmp_path, at_least=5) == 5  # a number asked for


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path: Path) -> None:
    for n in (0, 1, 2, 3):
        (tmp_path / f"checkpoint_{n}").mkdir()
    assert prune(tmp_path, keep=2, newest=0) == []  # nothing is older than checkpoint_0
    assert prune(tmp_path, keep=1, newest=2) == [
        tmp_path / "checkpoint_0",
        tmp_path / "checkpoint_1",
    ]
    assert [p.name for p in numbered_checkpoints(tmp_path)] == ["checkpoint_2", "checkpoint_3"]
    assert prune(tmp_path, keep=3, newest=3) == []  # within the limit
