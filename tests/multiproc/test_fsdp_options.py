"""FSDP options on real worker groups: an Accelerate FSDP script with only its import changed,
the launcher's switch, activation checkpointing (and its offload), resharding after forward,
weights only on rank 0, ignored modules and the mixed precision policy. Each option is told from
a no-op by what it changes (forward passes run, parameters gathered, tensors saved), and from a
mistake by the numbers it leaves alone."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_models import Net, forward_calls, loader
from torch.distributed.tensor import DTensor

from nb_accel import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher
from nb_accel.utils import set_seed

pytestmark = pytest.mark.timeout(240)

#: Written for Accelerate (its FSDP guide's plugin and calls); the test swaps the imports.
ACCELERATE_FSDP_SCRIPT = """
import torch
from torch.distributed.fsdp.fully_sharded_data_parallel import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
)
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.utils import set_seed

fsdp_plugin = FullyShardedDataParallelPlugin(
    fsdp_version=2,
    reshard_after_forward=True,
    auto_wrap_policy="size_based_wrap",
    min_num_params=200,
    state_dict_type="SHARDED_STATE_DICT",
    state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
    optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False),
)
accelerator = Accelerator(fsdp_plugin=fsdp_plugin)
set_seed(42)
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(128, 16, generator=generator)
labels = (inputs[:, :8].sum(dim=1) > 0).long()
train_dataloader = DataLoader(TensorDataset(inputs, labels), batch_size=8, shuffle=True)
eval_dataloader = DataLoader(TensorDataset(inputs, labels), batch_size=16)
model = torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
    torch.nn.Linear(32, 2),
)
optimizer = torch.optim.AdamW(params=model.parameters(), lr=1e-2)
lr_scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=40)
model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
)
for epoch in range(5):
    model.train()
    for inputs_, labels_ in train_dataloader:
        loss = torch.nn.functional.cross_entropy(model(inputs_), labels_)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
    model.eval()
    correct = total = 0
    for inputs_, labels_ in eval_dataloader:
        with torch.no_grad():
            predictions = model(inputs_).argmax(dim=-1)
        predictions, references = accelerator.gather_for_metrics((predictions, labels_))
        correct += (predictions == references).sum().item()
        total += references.numel()
    accelerator.print(f"epoch {epoch}: accuracy {correct / total:.3f}")
accelerator.save_state(OUTPUT_DIR + "/state")
accelerator.wait_for_everyone()
state_dict = accelerator.get_state_dict(model)
accelerator.save_model(model, OUTPUT_DIR + "/model")
RESULT = (accelerator.distributed_type.value, correct / total, total, sorted(state_dict))
"""


def run_script(source: str, output_dir: str) -> Any:
    namespace: dict[str, Any] = {"OUTPUT_DIR": output_dir}
    exec(compile(source, "accelerate_fsdp_script.py", "exec"), namespace)
    return namespace["RESULT"]


def test_an_accelerate_fsdp_script_runs_with_only_the_import_changed(tmp_path: Path) -> None:
    source = ACCELERATE_FSDP_SCRIPT.replace("from accelerate", "from nb_accel")
    assert "accelerate" not in source.replace("Accelerator", "").replace("accelerator", "")
    results = notebook_launcher(run_script, (source, str(tmp_path)), 2, show_progress=False)
    kind, accuracy, total, names = results[0]
    assert kind == "FSDP" and total == 128 and accuracy > 0.8
    assert names == ["0.bias", "0.weight", "2.bias", "2.weight", "4.bias", "4.weight"]
    assert results[1][3] == []  # whole weights on the main process only
    assert (tmp_path / "state" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert (tmp_path / "model" / "model.safetensors").is_file()


def launched_type() -> tuple[str, str]:
    accelerator = Accelerator()
    model = accelerator.prepare(Net())
    return accelerator.distributed_type.value, type(model).__name__


def test_the_launch_switch_turns_fsdp_on() -> None:
    on = notebook_launcher(launched_type, (), 2, show_progress=False, fsdp=True)
    assert on == [("FSDP", "FSDPNet")] * 2
    off = notebook_launcher(launched_type, (), 2, show_progress=False, fsdp=False)
    assert off == [("MULTI_CPU", "DistributedDataParallel")] * 2


#: Training steps of :func:`train`, and the blocks of its model.
STEPS, BLOCKS = 6, 3


def _saved_outside(count: list[int]) -> torch.autograd.graph.saved_tensors_hooks:
    """Count the tensors autograd saves for the backward pass outside any offloaded unit (an
    offloaded unit's own ``save_on_cpu`` hooks, innermost, take the ones saved inside it)."""

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        return tensor

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)


def train(options: dict[str, Any]) -> dict[str, Any]:
    """Six steps with the plugin options given; rank 0's final whole weights, and what the
    options changed along the way."""
    from nb_accel.runtime.fsdp.activations import is_checkpointed, is_offloaded

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(**options))
    set_seed(1)
    meta = options.get("cpu_ram_efficient_loading") and not accelerator.is_main_process
    with torch.device("meta" if meta else "cpu"):
        model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, data = accelerator.prepare(model, optimizer, loader())
    kinds = {name: isinstance(p, DTensor) for name, p in model.named_parameters()}
    saved = [0]
    for step, (x, y) in enumerate(data):
        with _saved_outside(saved) if step == 0 else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if step == 0:  # between forward and backward: are the blocks' parameters gathered?
            gathered = [not isinstance(p, DTensor) for b in model.blocks for p in b.parameters()]
        accelerator.backward(loss)
        if step == 0:
            grads = {name: p.grad.dtype for name, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        if step == STEPS - 1:
            break
    return {
        "weights": accelerator.get_state_dict(model),
        "sharded": kinds,
        "grads": grads,
        "forward_calls": forward_calls(model),
        "gathered_after_forward": gathered,
        "checkpointed": [is_checkpointed(block) for block in model.blocks],
        "offloaded": [is_offloaded(block) for block in model.blocks],
        "saved_outside": saved[0],
    }


def _baseline() -> dict[str, torch.Tensor]:
    return notebook_launcher(train, ({},), 2, show_progress=False)[0]["weights"]


@pytest.mark.parametrize(
    "options",
    [
        {"activation_checkpointing": True, "auto_wrap_policy": "transformer_based_wrap"},
        {"activation_checkpointing": True, "activation_checkpointing_offload": True},
        {"cpu_ram_efficient_loading": True},
        {"reshard_after_forward": False},
    ],
    ids=[
        "activation-checkpointing",
        "checkpointing-offload",
        "weights-on-rank-0-only",
        "no-reshard",
    ],
)
def test_options_that_do_not_change_the_numbers(options: dict[str, Any]) -> None:
    options = {"transformer_cls_names_to_wrap": ["Block"], **options}
    result = notebook_launcher(train, (options,), 2, show_progress=False)[0]
    for name, value in _baseline().items():
        torch.testing.assert_close(result["weights"][name], value, atol=1e-6, rtol=0)


def _launch(options: dict[str, Any]) -> dict[str, Any]:
    options = {"transformer_cls_names_to_wrap": ["Block"], **options}
    return notebook_launcher(train, (options,), 2, show_progress=False)[0]


def test_activation_checkpointing_runs_each_blocks_forward_again_in_the_backward() -> None:
    plain = _launch({})
    checkpointed = _launch({"activation_checkpointing": True})
    offloaded = _launch(
        {"activation_checkpointing": True, "activation_checkpointing_offload": True}
    )
    assert plain["forward_calls"] == STEPS * BLOCKS
    assert checkpointed["forward_calls"] == offloaded["forward_calls"] == 2 * STEPS * BLOCKS
    assert plain["checkpointed"] == [False] * BLOCKS and plain["offloaded"] == [False] * BLOCKS
    assert checkpointed["checkpointed"] == [True] * BLOCKS
    assert checkpointed["offloaded"] == [False] * BLOCKS
    assert offloaded["checkpointed"] == offloaded["offloaded"] == [True] * BLOCKS
    # what the checkpointed blocks save for their recompute (each block's input) goes to the
    # offload's save_on_cpu instead of the hooks around the model
    assert checkpointed["saved_outside"] < plain["saved_outside"]  # recomputed, not kept
    assert offloaded["saved_outside"] <= checkpointed["saved_outside"] - BLOCKS
    for result in (checkpointed, offloaded):
        for name, value in plain["weights"].items():
            torch.testing.assert_close(result["weights"][name], value, atol=1e-6, rtol=0)


def test_reshard_after_forward_false_keeps_the_blocks_gathered_until_backward() -> None:
    resharded = _launch({"reshard_after_forward": True})
    kept = _launch({"reshard_after_forward": False})
    assert resharded["gathered_after_forward"] == [False] * 6 * BLOCKS  # 6 parameters each
    assert kept["gathered_after_forward"] == [True] * 6 * BLOCKS
    assert all(kept["sharded"].values())  # sharded again once the backward has run
    for name, value in resharded["weights"].items():
        torch.testing.assert_close(kept["weights"][name], value, atol=1e-6, rtol=0)


def test_ignored_modules_stay_whole() -> None:
    result = notebook_launcher(train, ({"ignored_modules": "head"},), 2, show_progress=False)
    sharded = result[0]["sharded"]
    assert not sharded["head.weight"] and not sharded["head.bias"]
    assert all(kind for name, kind in sharded.items() if not name.startswith("head."))


def test_a_bf16_policy_computes_in_bf16_and_keeps_fp32_weights() -> None:
    policy = {"mixed_precision_policy": {"param_dtype": "bf16", "reduce_dtype": "bf16"}}
    result = notebook_launcher(train, (policy,), 2, show_progress=False)[0]
    assert set(result["grads"].values()) == {torch.float32}  # sharded gradients: fp32 params
    baseline = _baseline()
    differences = []
    for name, value in result["weights"].items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, baseline[name], atol=2e-2, rtol=0)
        differences.append(float((value - baseline[name]).abs().max()))
    assert max(differences) > 1e-6  # computed in bf16: not the fp32 numbers
