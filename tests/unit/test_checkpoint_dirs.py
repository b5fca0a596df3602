"""Checkpoint folders appear whole or not at all; every file and folder is flushed to disk and
the rename after them; numbering continues past what is on disk; only checkpoints older than the
one just written are pruned; leftovers are removed, and a copy set aside by an interrupted
replacement is put back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nb_accel.runtime.checkpoint import durable
from nb_accel.runtime.checkpoint.durable import sync_tree
from nb_accel.runtime.checkpoint.folders import (
    checkpoint_number,
    commit,
    make_staging,
    next_checkpoint_number,
    numbered_checkpoints,
    prune,
    set_aside_copy,
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


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes ``fsync`` is called on, in order."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    return synced


def test_every_file_and_folder_of_a_checkpoint_is_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = make_staging(tmp_path / "ckpt")
    (staging / "pytorch_model_fsdp_0").mkdir()
    for name in ("model.safetensors", "pytorch_model_fsdp_0/__1_0.distcp"):
        (staging / name).write_text(name)
    synced = _record_fsyncs(monkeypatch)
    sync_tree(staging)
    inodes = [p.stat().st_ino for p in (staging, *staging.rglob("*"))]
    assert sorted(synced) == sorted(inodes)
    assert synced[-1] == staging.stat().st_ino  # folders after what they hold
    synced.clear()
    commit(staging, tmp_path / "ckpt")
    assert synced[-1] == tmp_path.stat().st_ino  # the rename itself is flushed


def test_a_copy_set_aside_by_an_interrupted_replacement_is_the_checkpoint(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    aside = tmp_path / ".ckpt.replaced-0123456789ab"
    aside.mkdir()
    _fill(aside, "old")
    staged = make_staging(tmp_path / "other")  # another checkpoint's staging: kept
    assert set_aside_copy(final) == aside
    pruned = tmp_path / ".checkpoint_1.pruned-0123456789ab"
    pruned.mkdir()
    fresh = make_staging(final)  # puts the copy back first, removes what was half pruned
    assert (final / "weights.txt").read_text() == "old" and set_aside_copy(final) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", fresh.name, staged.name])
