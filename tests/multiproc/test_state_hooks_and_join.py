"""Checkpoint hooks, get_state_dict, trigger_sync_in_backward and join_uneven_inputs on real
two-process gloo groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import Accelerator, notebook_launcher


def _prepared(accelerator: Accelerator) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return accelerator.prepare(model, optimizer)


def hooks_run(folder: str) -> dict[str, Any]:
    accelerator = Accelerator()
    model, _ = _prepared(accelerator)
    calls: list[tuple[Any, ...]] = []

    def on_save(models: list[nn.Module], weights: list[dict[str, Any]], output_dir: str) -> None:
        calls.append(("save", models[0] is model, sorted(weights[0]), len(weights)))
        if accelerator.is_main_process:
            (Path(output_dir) / "extra.txt").write_text("hooked")

    def on_load(models: list[nn.Module], input_dir: str) -> None:
        calls.append(("load", models[0] is model, (Path(input_dir) / "extra.txt").read_text()))

    save_handle = accelerator.register_save_state_pre_hook(on_save)
    load_handle = accelerator.register_load_state_pre_hook(on_load)
    first = accelerator.save_state(str(Path(folder) / "first"))
    accelerator.load_state(first)
    save_handle.remove()
    load_handle.remove()
    second = accelerator.save_state(str(Path(folder) / "second"))
    accelerator.load_state(first)
    return {
        "calls": calls,
        "extra_in_first": (Path(first) / "extra.txt").is_file(),
        "extra_in_second": (Path(second) / "extra.txt").is_file(),
    }


@pytest.mark.timeout(120)
def test_state_hooks_get_accelerates_arguments_and_can_be_removed(tmp_path: Path) -> None:
    for result in notebook_launcher(hooks_run, args=(str(tmp_path),), num_processes=2, timeout=30):
        assert result["calls"] == [
            ("save", True, ["bias", "weight"], 1),  # unwrapped weights: no "module." prefix
            ("load", True, "hooked"),
        ]
        assert result["extra_in_first"] and not result["extra_in_second"]


def weights_left_out(folder: str) -> list[float]:
    """A save hook that saves the model itself and removes its weights; the load hook takes
    the model out of the list and loads it the same way."""
    accelerator = Accelerator()
    model, _ = _prepared(accelerator)

    def on_save(models: list[nn.Module], weights: list[dict[str, Any]], output_dir: str) -> None:
        if accelerator.is_main_process:
            torch.save(weights[0], Path(output_dir) / "own.pt")
        weights.pop()

    def on_load(models: list[nn.Module], input_dir: str) -> None:
        accelerator.unwrap_model(models.pop()).load_state_dict(
            torch.load(Path(input_dir) / "own.pt", weights_only=True)
        )

    accelerator.register_save_state_pre_hook(on_save)
    accelerator.register_load_state_pre_hook(on_load)
    saved = accelerator.save_state(str(Path(folder) / "own"))
    assert not any(Path(saved).glob("model*.safetensors"))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.load_state(saved)
    return accelerator.unwrap_model(model).weight.flatten().tolist()


@pytest.mark.timeout(120)
def test_a_save_hook_can_take_over_a_models_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    expected = nn.Linear(3, 2).weight.flatten().tolist()
    for weights in notebook_launcher(
        weights_left_out, args=(str(tmp_path),), num_processes=2, timeout=30
    ):
        assert weights == pytest.approx(expected)


def state_dicts() -> dict[str, Any]:
    accelerator = Accelerator()
    model, _ = _prepared(accelerator)
    unwrapped = accelerator.get_state_dict(model)
    wrapped = accelerator.get_state_dict(model, unwrap=False)
    reference = accelerator.unwrap_model(model).state_dict()
    return {
        "keys": sorted(unwrapped),
        "wrapped_keys": sorted(wrapped),
        "equal": all(torch.equal(unwrapped[k], reference[k]) for k in reference)
        and sorted(unwrapped) == sorted(reference),
    }


@pytest.mark.timeout(120)
def test_get_state_dict_is_the_unwrapped_models_on_every_rank() -> None:
    for result in notebook_launcher(state_dicts, num_processes=2, timeout=30):
        assert result["equal"]
        assert result["keys"] == ["bias", "weight"]
        assert result["wrapped_keys"] == ["module.bias", "module.weight"]


def sync_inside_accumulate(trigger: bool) -> list[float]:
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, _ = _prepared(accelerator)
    x = torch.full((1, 3), float(accelerator.process_index + 1))
    with accelerator.accumulate(model):  # the first of four batches: no all-reduce
        assert not accelerator.sync_gradients
        loss = model(x).sum()
        if trigger:
            with accelerator.trigger_sync_in_backward(model):
                accelerator.backward(loss)
        else:
            accelerator.backward(loss)
    return accelerator.unwrap_model(model).weight.grad.flatten().tolist()


@pytest.mark.timeout(120)
def test_trigger_sync_in_backward_all_reduces_inside_accumulate() -> None:
    plain = notebook_launcher(sync_inside_accumulate, args=(False,), num_processes=2, timeout=30)
    assert plain[0] != plain[1]  # the ranks' inputs differ, and nothing was reduced
    synced = notebook_launcher(sync_inside_accumulate, args=(True,), num_processes=2, timeout=30)
    assert synced[0] == synced[1]
    # the mean over ranks of each rank's gradient (inputs 1 and 2), divided by the 4 steps
    assert synced[0] == pytest.approx([1.5 / 4] * 6)


def uneven_training(override: bool) -> dict[str, Any]:
    accelerator = Accelerator(even_batches=override)
    model, optimizer = _prepared(accelerator)
    data = DataLoader(TensorDataset(torch.randn(5, 3)), batch_size=1)  # 3 batches and 2
    loader = accelerator.prepare(data)
    steps = 0
    with accelerator.join_uneven_inputs([model], even_batches=False if override else None):
        inside = loader.even_batches
        for (x,) in loader:
            accelerator.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    return {"steps": steps, "inside": inside, "after": loader.even_batches}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("override", [True, False], ids=["override", "accelerator-setting"])
def test_join_uneven_inputs_lets_ranks_with_fewer_batches_finish(override: bool) -> None:
    results = notebook_launcher(uneven_training, args=(override,), num_processes=2, timeout=20)
    assert [r["steps"] for r in results] == [3, 2]
    for result in results:
        assert result["inside"] is False
        assert result["after"] is override  # restored once the block ends
