"""A save killed at any step of its commit leaves the previous save or the new one, never a mix.

Each test saves version 1 here, then has a process of its own save version 2 with
``NB_ACCEL_TEST_CRASH_AT`` naming one step of the commit sequence (:mod:`crash_saves`): it kills
itself there with ``SIGKILL``. The load that follows must find version 1 everywhere (a crash
before the commit) or version 2 everywhere (after it), and the next save must work.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from crash_saves import model_versions, save_model, save_state, state_versions

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).with_name("crash_saves.py")


@pytest.fixture(autouse=True)
def _compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.optim loads inductor, which sets its cache folder in the environment: the test's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile_cache"))


def _killed_at(step: str, kind: str, folder: Path, *options: str) -> None:
    """Save version 2 in a process of its own that dies at ``step``; fail if it did not."""
    env = {**os.environ, "NB_ACCEL_TEST_CRASH_AT": step}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), kind, str(folder), "2", *options],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == -signal.SIGKILL, (
        f"the save did not die at {step!r} (exit {done.returncode}): {done.stderr[-2000:]}"
    )


def _hidden(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir() if entry.name.startswith("."))


#: ``save_model`` (a batch of files in a folder holding other files): each step, and whether
#: the new files are committed there.
FILE_STEPS = {
    "files-written": False,  # every file written aside and flushed; nothing committed
    "files-committed": True,  # the list of files renamed in: the commit
    "files-placing": True,  # the first file renamed onto its name
    "files-placed": True,  # every file in place, the replaced ones not yet removed
    "files-removed": True,  # the replaced files removed, the hidden folder not yet
}


@pytest.mark.parametrize("step", FILE_STEPS)
def test_save_model_killed_at_a_step_leaves_the_old_files_or_the_new(
    step: str, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    save_model(folder, 1)
    (folder / "config.json").write_text("{}")  # another file of the folder: never touched
    _killed_at(step, "model", folder)
    assert model_versions(folder) == ({2.0} if FILE_STEPS[step] else {1.0})
    save_model(folder, 3)  # the next save tidies what the crash left
    assert model_versions(folder) == {3.0}
    assert _hidden(folder) == []
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]


#: ``save_state`` into a folder it replaces, on a file system that swaps two folders in one
#: step (Linux's ``renameat2``): each step, and whether the new checkpoint is in place.
SWAP_STEPS = {"state-written": False, "state-recorded": False, "state-renamed": True}
SWAP_STEPS |= {"state-placed": True}
#: The same where folders cannot be swapped (NFS): the old one is renamed aside first.
ASIDE_STEPS = {"state-recorded": False, "state-set-aside": False, "state-renamed": True}
ASIDE_STEPS |= {"state-placed": True}


@pytest.mark.parametrize(
    ("step", "aside"),
    [(step, False) for step in SWAP_STEPS] + [(step, True) for step in ASIDE_STEPS],
)
def test_save_state_killed_while_replacing_a_checkpoint_leaves_the_old_or_the_new(
    step: str, aside: bool, tmp_path: Path
) -> None:
    folder = tmp_path / "checkpoint"
    save_state(folder, 1)
    _killed_at(step, "state", folder, *(["aside"] if aside else []))
    committed = (ASIDE_STEPS if aside else SWAP_STEPS)[step]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert state_versions(folder) == ({2.0} if committed else {1.0})
    set_aside = step == "state-set-aside"
    assert any("which it set aside as" in str(w.message) for w in caught) == set_aside
    save_state(folder, 3)  # puts a set-aside copy back first, removes what the crash left
    assert state_versions(folder) == {3.0}
    assert _hidden(tmp_path) == []


#: ``save_state`` with automatic naming and one checkpoint kept: each step, and whether the new
#: checkpoint is the newest.
AUTOMATIC_STEPS = {"state-recorded": False, "state-renamed": True, "state-pruning": True}


@pytest.mark.parametrize("step", AUTOMATIC_STEPS)
def test_save_state_killed_with_automatic_naming_loads_the_newest_complete_checkpoint(
    step: str, tmp_path: Path
) -> None:
    save_state(tmp_path, 1, automatic=True)
    _killed_at(step, "automatic", tmp_path)
    committed = AUTOMATIC_STEPS[step]
    assert state_versions(tmp_path, automatic=True) == ({2.0} if committed else {1.0})
    save_state(tmp_path, 3, automatic=True)  # numbered past the newest checkpoint in place
    assert state_versions(tmp_path, automatic=True) == {3.0}
    newest = "checkpoint_2" if committed else "checkpoint_1"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [newest]


def test_a_folder_whose_save_never_completed_is_refused_or_passed_over(tmp_path: Path) -> None:
    """Named, a folder without the description file written last is refused, saying what to
    do; with automatic naming, a newer folder of that kind is passed over with a warning."""
    save_state(tmp_path, 1, automatic=True)
    checkpoints = tmp_path / "checkpoints"
    incomplete = checkpoints / "checkpoint_5"
    incomplete.mkdir()
    (incomplete / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"is not a complete checkpoint.*Load an earlier"):
        state_versions(incomplete)
    with pytest.warns(UserWarning, match=r"checkpoint_5 in .* is not a complete checkpoint"):
        assert state_versions(tmp_path, automatic=True) == {1.0}
    save_state(tmp_path, 2, automatic=True)  # numbered past every folder there
    assert (checkpoints / "checkpoint_6" / "nb_accel_checkpoint.json").is_file()


def test_a_damaged_list_of_files_to_place_is_a_clear_error(tmp_path: Path) -> None:
    from nb_accel.runtime.checkpoint.file_batch import finish_placement

    save_model(tmp_path, 1)
    batch = tmp_path / ".nb_accel-files-0123456789ab"
    batch.mkdir()
    (batch / "nb_accel-placement.json").write_text("{not json")
    with pytest.raises(OSError, match=r"is damaged .* remove .*nb_accel-files-0123456789ab"):
        finish_placement(tmp_path)
    with pytest.raises(OSError, match="is damaged"):
        model_versions(tmp_path)


def test_every_file_a_save_commits_was_flushed_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files, their folder and the folder the rename changes are all flushed to disk."""
    from nb_accel.runtime.checkpoint import durable

    synced: set[int] = set()
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.add(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    save_state(tmp_path / "checkpoint", 1)
    save_model(tmp_path / "model", 1)
    written = [tmp_path, *(tmp_path / "checkpoint").rglob("*"), *(tmp_path / "model").rglob("*")]
    assert {p.stat().st_ino for p in written} - synced == set()


def test_every_crash_point_of_the_commit_sequences_is_tested() -> None:
    """A step added to a commit sequence gets its kill in the tests above."""
    import nb_accel.runtime.checkpoint as package

    source = "".join(p.read_text() for p in Path(package.__file__).parent.glob("*.py"))
    points = set(re.findall(r'crash_point\("([a-z-]+)"\)', source))
    tested = set(FILE_STEPS) | set(SWAP_STEPS) | set(ASIDE_STEPS) | set(AUTOMATIC_STEPS)
    assert points == tested
