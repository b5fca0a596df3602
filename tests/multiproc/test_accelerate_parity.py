"""Behaviours Accelerate's own test scripts rely on, on two real processes: a pickled
Accelerator keeps its state, a join under a non-DDP setup warns, a reset state says so,
debug mode checks pad_across_processes, and processes that each name their own checkpoint
folder still save and resume one checkpoint."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
import torch
from torch.utils.data import DataLoader

from nb_accel import Accelerator, DistributedType, PartialState, notebook_launcher
from nb_accel.runtime.state import AcceleratorState
from nb_accel.utils import DistributedOperationException, pad_across_processes


def pickle_and_join() -> dict[str, Any]:
    accelerator = Accelerator()
    copy = pickle.loads(pickle.dumps(accelerator))
    same_state = accelerator.state.__dict__ == copy.state.__dict__
    accelerator.state.distributed_type = DistributedType.FSDP
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([Mock()]):
            pass
    accelerator.state.distributed_type = DistributedType.MULTI_CPU
    return {"same_state": same_state, "warnings": [str(w.message) for w in caught]}


def test_a_pickled_accelerator_keeps_its_state_and_join_warns_outside_ddp() -> None:
    for out in notebook_launcher(pickle_and_join, num_processes=2):
        assert out["same_state"] is True
        assert any("only supported for multi-GPU" in text for text in out["warnings"])


def reset_then_prepare() -> str:
    accelerator = Accelerator()
    AcceleratorState._reset_state()
    try:
        accelerator.prepare(torch.nn.Linear(1, 1))
    except AttributeError as error:
        return str(error)
    finally:
        PartialState().wait_for_everyone()  # methods still reach the process's state
    return "prepared"


def test_a_reset_accelerator_state_says_what_happened() -> None:
    for message in notebook_launcher(reset_then_prepare, num_processes=2):
        assert "`AcceleratorState` object has no attribute" in message
        assert "This happens if `AcceleratorState._reset_state()`" in message


def pad_in_debug_mode() -> list[str]:
    state = PartialState()
    rank = state.process_index
    state.debug = True
    try:
        # Different sizes along `dim` are what padding is for: no error.
        padded = pad_across_processes(torch.zeros(rank + 1, 3), dim=0)
        outcome = [str(tuple(padded.shape))]
        try:  # a different number of dimensions cannot be padded
            pad_across_processes(torch.zeros([1] * (rank + 2)), dim=0)
            outcome.append("no error")
        except DistributedOperationException as error:
            outcome.append(str(error))
    finally:
        state.debug = False
    return outcome


def test_debug_mode_checks_what_pad_across_processes_needs() -> None:
    for shape, error in notebook_launcher(pad_in_debug_mode, num_processes=2):
        assert shape == "(2, 3)"
        assert "pad_across_processes needs" in error and "the others" in error


def own_folders(root: Path) -> list[list[int]]:
    accelerator = Accelerator()
    folder = root / f"process_{accelerator.process_index}"  # each process names its own
    folder.mkdir()
    loader = accelerator.prepare(DataLoader(list(range(16)), batch_size=2, shuffle=True))
    seen: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step, batch in enumerate(loader):
            if step == 1:
                accelerator.save_state(folder)
            if step > 1:
                seen += batch.tolist()
        accelerator.load_state(folder)
    resumed = [x for batch in accelerator.skip_first_batches(loader, 2) for x in batch.tolist()]
    return [seen, resumed]


@pytest.mark.timeout(120)
def test_processes_naming_their_own_checkpoint_folders_resume_one_checkpoint(
    tmp_path: Path,
) -> None:
    for seen, resumed in notebook_launcher(own_folders, args=(tmp_path,), num_processes=2):
        assert seen and resumed == seen
    assert (tmp_path / "process_0" / "nb_accel_checkpoint.json").is_file()
    assert not any((tmp_path / "process_1").iterdir())


def utils_helpers(folder: Path) -> dict[str, Any]:
    from nb_accel.utils import extract_model_from_parallel, save, tqdm, wait_for_everyone

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    bar = tqdm(range(3))  # drawn on the main process only
    disabled = bar.disable  # (closing a bar disables it)
    steps = sum(1 for _ in bar)
    save({"w": torch.ones(2)}, folder / "plain.pt")
    save({"w": torch.ones(2)}, folder / "tensors.safetensors", safe_serialization=True)
    wait_for_everyone()
    return {
        "plain": type(extract_model_from_parallel(model)).__name__,
        "steps": steps,
        "disabled": disabled,
        "files": sorted(p.name for p in folder.iterdir()),
    }


def test_utils_helpers_from_accelerates_examples(tmp_path: Path) -> None:
    first, second = notebook_launcher(utils_helpers, args=(tmp_path,), num_processes=2)
    assert first["plain"] == second["plain"] == "Linear"
    assert first["steps"] == second["steps"] == 3
    assert (first["disabled"], second["disabled"]) == (False, True)
    assert first["files"] == ["plain.pt", "tensors.safetensors"]


def test_write_basic_config_saves_the_launchers_default_once(tmp_path: Path) -> None:
    from nb_accel import load_config
    from nb_accel.utils import write_basic_config

    target = tmp_path / "config.yaml"
    assert write_basic_config(mixed_precision="bf16", save_location=target) == target
    assert load_config(target).mixed_precision == "bf16"
    assert write_basic_config(mixed_precision="fp16", save_location=target) is False
    assert load_config(target).mixed_precision == "bf16"


def join_with_an_iterable_loader() -> list[str]:
    from torch.utils.data import IterableDataset

    class Numbers(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(torch.arange(3))

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    accelerator.prepare(DataLoader(Numbers(), batch_size=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            pass
    return [str(w.message) for w in caught]


def test_join_says_an_iterable_loader_keeps_its_even_batches() -> None:
    for messages in notebook_launcher(join_with_an_iterable_loader, num_processes=2):
        assert "only supported for map-style datasets" in messages[-1]
