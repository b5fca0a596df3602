"""Accelerate's process-side names on two real processes: ``get_logger``'s main-process-only
and in-order records, ``on_local_process`` and ``PartialState.destroy_process_group``."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist
from markers import touch_when_waiting, wait_until

from nb_accel import Accelerator, PartialState, notebook_launcher
from nb_accel.logging import get_logger


def _log_to(path: Path) -> logging.Logger:
    """A fresh logger whose records are appended to ``path`` (flushed at once)."""
    logger = logging.getLogger("nb_accel_test_names")
    logger.handlers.clear()
    logger.propagate = False
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger


def log_three_ways(path: Path) -> None:
    accelerator = Accelerator()
    _log_to(path)
    logger = get_logger("nb_accel_test_names")
    logger.info("main only")
    logger.warning("everywhere %d", accelerator.process_index, main_process_only=False)
    accelerator.wait_for_everyone()
    rank1_waiting, rank1_logged = path.with_name("rank1-waiting"), path.with_name("rank1-logged")
    if accelerator.is_main_process:  # rank 1 would write first if the ranks did not take turns
        wait_until(lambda: rank1_waiting.exists() or rank1_logged.exists(), "rank 1's turn")
    else:
        touch_when_waiting(rank1_waiting)
    logger.info("in order", in_order=True)
    if not accelerator.is_main_process:
        rank1_logged.touch()
    logger.debug("below the level", main_process_only=False)


def test_get_logger_emits_on_the_main_process_unless_asked_and_in_order(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    notebook_launcher(log_three_ways, args=(path,), num_processes=2)
    lines = path.read_text().splitlines()
    assert sorted(lines[:3]) == [
        "INFO [RANK 0] main only",
        "WARNING [RANK 0] everywhere 0",
        "WARNING [RANK 1] everywhere 1",
    ]
    assert lines[3:] == ["INFO [RANK 0] in order", "INFO [RANK 1] in order"]


def local_process_and_groups() -> dict[str, object]:
    accelerator = Accelerator()

    @accelerator.on_local_process(local_process_index=1)
    def second() -> int:
        return accelerator.process_index

    ran = second()
    state = PartialState()
    pair = dist.new_group([0, 1])
    state.destroy_process_group(pair)
    try:
        dist.get_rank(pair)
        pair_usable = True
    except ValueError:  # "not registered"
        pair_usable = False
    state.destroy_process_group()  # the launch's group stays: it is nb_accel's to destroy
    total = torch.ones(1)
    dist.all_reduce(total)
    return {"ran": ran, "pair_usable": pair_usable, "total": total.item()}


def test_on_local_process_and_destroy_process_group() -> None:
    results = notebook_launcher(local_process_and_groups, num_processes=2)
    assert [r["ran"] for r in results] == [None, 1]
    assert [r["pair_usable"] for r in results] == [False, False]
    assert [r["total"] for r in results] == [2.0, 2.0]


def share_from_rank_one() -> list[int]:
    from nb_accel.utils.operations import copy_tensor_to_devices

    state = PartialState()
    mine = torch.tensor([1, 2, 3], dtype=torch.int32) if state.process_index == 1 else None
    shared = copy_tensor_to_devices(mine)
    assert shared.dtype == torch.int32
    return shared.tolist()


def test_copy_tensor_to_devices_gives_every_rank_the_one_tensor() -> None:
    assert notebook_launcher(share_from_rank_one, num_processes=2) == [[1, 2, 3], [1, 2, 3]]


def test_utils_submodules_hold_the_names_where_accelerate_has_them() -> None:
    from nb_accel.utils import dataclasses, imports, memory, modeling, operations, random

    assert dataclasses.DistributedType is PartialState().distributed_type.__class__
    assert operations.gather is __import__("nb_accel").utils.gather
    assert random.set_seed and memory.find_executable_batch_size and modeling
    assert imports.is_pytest_available() is True
    assert imports.is_fp16_available() is True
