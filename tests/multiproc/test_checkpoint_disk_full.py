"""``save_state`` meeting a full disk: every rank raises ``OSError`` (``ENOSPC``) saying the
disk is full, where, and what to do (torch's own writer says only ``unexpected pos 1088 vs
982``); the previous checkpoint stays whole and no staging folder is left. Found by the chaos
campaign (a ``disk-full`` fault in every style)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from small_disk import fill, small_disk

from nb_accel import Accelerator, ProjectConfiguration, notebook_launcher

pytestmark = pytest.mark.timeout(120)

#: The file system the checkpoints are written to: room for a few of them.
DISK_BYTES = 4 << 20


def _train(project: str, filler: str) -> list[str]:
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    accelerator.save_state()  # checkpoint_0: written whole
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        fill(Path(filler))
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state()  # checkpoint_1: the disk is full
    except OSError as error:
        assert error.errno == errno.ENOSPC
        return [str(error)]
    finally:
        del model
    return []


def test_a_full_disk_is_said_plainly_and_the_previous_checkpoint_stays(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", DISK_BYTES) as disk:
        said = notebook_launcher(
            _train, args=(str(disk / "project"), str(disk / "filler")), num_processes=2
        )
        folder = disk / "project" / "checkpoints"
        left = sorted(p.name for p in folder.iterdir())
        whole = (folder / "checkpoint_0" / "nb_accel_checkpoint.json").exists()
    for rank, errors in enumerate(said):
        assert len(errors) == 1, (rank, said)
        message = errors[0]
        assert "No space left on device: writing checkpoint" in message, message
        assert f"failed on process {rank}" in message, message
        assert "Free space there, or save elsewhere" in message, message
    assert left == ["checkpoint_0"] and whole  # no checkpoint_1, no staging folder
