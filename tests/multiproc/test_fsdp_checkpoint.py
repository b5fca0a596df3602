"""FSDP checkpoints on real worker groups: sharded and full save_state/load_state round trips,
an exact resume, whole weights a plain model loads, a clear error for another world size, and
the previous checkpoint kept when a process dies after writing its shards."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_models import Net, loader
from safetensors.torch import load_file

from nb_accel import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    WorkerDiedError,
    notebook_launcher,
)
from nb_accel.utils import merge_fsdp_weights, set_seed

pytestmark = pytest.mark.timeout(240)

STEPS, SAVE_AT = 14, 6  # 12 batches per epoch on 2 ranks: the save falls in the first epoch


def _local(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.to_local().detach().clone() for n, p in model.named_parameters()}


def run(folder: str, mode: str, kind: str, checkpointing: bool = False) -> dict[str, Any]:
    """``full``: STEPS steps, saving at SAVE_AT. ``first``: SAVE_AT steps, save, stop.
    ``resume``: load, then the remaining steps. ``checkpointing``: activation checkpointing
    and its offload (torch's wrappers around each block, which rename its parameters)."""
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type=kind,
        activation_checkpointing=checkpointing,
        activation_checkpointing_offload=checkpointing,
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    set_seed(3)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
    data = loader(shuffle=True)
    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, data, scheduler)
    result: dict[str, Any] = {}
    step = 0
    epoch = data
    if mode == "resume":
        accelerator.load_state(folder)
        result["loaded"] = _local(model)
        step = SAVE_AT
        epoch = accelerator.skip_first_batches(data, SAVE_AT)  # the rest of the saved epoch
    losses = []
    while step < STEPS:
        for x, y in epoch:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            if step == SAVE_AT and mode != "resume":
                accelerator.save_state(folder)
                result["saved"] = _local(model)
                if mode == "first":
                    return result
            if step == STEPS:
                break
        epoch = data
    result["losses"] = losses
    result["final"] = _local(model)
    result["whole"] = accelerator.get_state_dict(model)
    accelerator.save_model(model, Path(folder).parent / "final")
    return result


@pytest.mark.parametrize("kind", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_a_resumed_run_continues_exactly(tmp_path: Path, kind: str) -> None:
    full = notebook_launcher(
        run, (str(tmp_path / "a" / "ckpt"), "full", kind), 2, show_progress=False
    )
    notebook_launcher(run, (str(tmp_path / "b" / "ckpt"), "first", kind), 2, show_progress=False)
    resumed = notebook_launcher(
        run, (str(tmp_path / "b" / "ckpt"), "resume", kind), 2, show_progress=False
    )
    for rank in range(2):
        saved, loaded = full[rank]["saved"], resumed[rank]["loaded"]
        assert saved.keys() == loaded.keys()
        for name in saved:  # the same local shards after loading
            assert torch.equal(saved[name], loaded[name]), name
        for name, value in full[rank]["final"].items():  # and the same training after
            assert torch.equal(resumed[rank]["final"][name], value), name
    assert resumed[0]["losses"] == full[0]["losses"][SAVE_AT:]
    checkpoint = tmp_path / "b" / "ckpt"
    if (
        kind == "SHARDED_STATE_DICT"
    ):  # one shard file per rank, through torch.distributed.checkpoint
        for part in ("pytorch_model_fsdp_0", "optimizer_0"):
            assert sorted(p.name for p in (checkpoint / part).iterdir()) == [
                ".metadata",
                "__0_0.distcp",
                "__1_0.distcp",
            ]
        assert not (checkpoint / "model.safetensors").exists()
    else:  # whole weights a plain model loads
        plain = Net()
        plain.load_state_dict(load_file(checkpoint / "model.safetensors"))
        assert (checkpoint / "optimizer.bin").is_file()


def test_whole_weights_load_into_a_plain_model(tmp_path: Path) -> None:
    results = notebook_launcher(
        run, (str(tmp_path / "a" / "ckpt"), "full", "SHARDED_STATE_DICT"), 2, show_progress=False
    )
    whole = results[0]["whole"]
    assert results[1]["whole"] == {}
    plain = Net()
    plain.load_state_dict(load_file(tmp_path / "a" / "final" / "model.safetensors"))  # save_model
    for name, value in plain.state_dict().items():
        assert torch.equal(value, whole[name]), name
    merged = merge_fsdp_weights(tmp_path / "a" / "ckpt" / "pytorch_model_fsdp_0", tmp_path / "m")
    from_checkpoint = Net()
    from_checkpoint.load_state_dict(load_file(merged))
    for name, shard in results[0]["saved"].items():  # rank 0's shards at the save
        rows = shard.shape[0]
        assert torch.equal(from_checkpoint.state_dict()[name][:rows], shard), name


def test_a_checkpointed_model_saves_and_loads_under_its_plain_names(tmp_path: Path) -> None:
    folder = str(tmp_path / "a" / "ckpt")
    wrapped = notebook_launcher(
        run, (folder, "full", "SHARDED_STATE_DICT", True), 2, show_progress=False
    )
    plain = Net()
    assert sorted(wrapped[0]["whole"]) == sorted(plain.state_dict())  # no wrapper's prefix
    plain.load_state_dict(load_file(tmp_path / "a" / "final" / "model.safetensors"))
    # the wrapped run's checkpoint resumes a run without the wrappers, step for step
    resumed = notebook_launcher(
        run, (folder, "resume", "SHARDED_STATE_DICT", False), 2, show_progress=False
    )
    assert resumed[0]["losses"] == pytest.approx(wrapped[0]["losses"][SAVE_AT:], abs=1e-6)
    for name, value in wrapped[0]["whole"].items():
        torch.testing.assert_close(resumed[0]["whole"][name], value, atol=1e-6, rtol=0)


def load_elsewhere(folder: str) -> None:
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(folder)


def test_a_checkpoint_from_another_world_size_is_refused(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    notebook_launcher(run, (folder, "first", "SHARDED_STATE_DICT"), 2, show_progress=False)
    with pytest.raises(ValueError, match="saved by 2 processes and this launch has 3"):
        notebook_launcher(load_elsewhere, (folder,), 3, show_progress=False)


def _sharded() -> tuple[Accelerator, torch.nn.Module]:
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type="SHARDED_STATE_DICT",
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    set_seed(3)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters())
    model, _ = accelerator.prepare(model, optimizer)
    return accelerator, model


def save_twice_one_rank_dies(folder: str) -> None:
    """Save the initial shards, change them, and save again: process 1 dies once it has
    written and flushed its shards of the second save, before the checkpoint is committed."""
    accelerator, model = _sharded()
    accelerator.save_state(folder)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    if accelerator.process_index == 1:
        os.environ["NB_ACCEL_TEST_CRASH_AT"] = "state-written"  # test-only: dies there
    accelerator.save_state(folder)


def load_sharded(folder: str) -> dict[str, bool]:
    accelerator, model = _sharded()
    initial = _local(model)
    accelerator.load_state(folder)
    return {name: torch.equal(value, initial[name]) for name, value in _local(model).items()}


def test_a_rank_killed_after_writing_its_shards_leaves_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    folder = str(tmp_path / "ckpt")
    with pytest.raises(WorkerDiedError, match="SIGKILL"):
        notebook_launcher(save_twice_one_rank_dies, (folder,), 2, show_progress=False)
    loaded = notebook_launcher(load_sharded, (folder,), 2, show_progress=False)
    assert all(all(same.values()) for same in loaded)  # every shard of the first save
