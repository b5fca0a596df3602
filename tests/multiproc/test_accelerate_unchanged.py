"""🤗 Accelerate's own ``Accelerator()``, written as for ``accelerate launch``, inside a launch:
it joins the launch's process group (MULTI_CPU here), shards loaders, gathers and trains in
step, and its failures reach the kernel like any other."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import nb_accel

accelerate = pytest.importorskip("accelerate")

pytestmark = pytest.mark.timeout(180)


def describe_state() -> dict[str, Any]:
    accelerator = accelerate.Accelerator()
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    shard = [batch.tolist() for batch in accelerator.prepare(loader)]
    rank = torch.tensor([accelerator.process_index])
    return {
        "type": accelerator.distributed_type.value,
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "local_process_index": accelerator.local_process_index,
        "device": accelerator.device.type,
        "mixed_precision": accelerator.mixed_precision,
        "shard": shard,
        "gathered": accelerator.gather(rank).tolist(),
    }


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_accelerate_s_accelerator_joins_the_launch(start_method: str) -> None:
    results = nb_accel.notebook_launcher(
        describe_state, num_processes=2, mixed_precision="bf16", start_method=start_method
    )
    for rank, state in enumerate(results):
        assert state["type"] == "MULTI_CPU"
        assert state["num_processes"] == 2
        assert state["process_index"] == rank and state["local_process_index"] == rank
        assert state["device"] == "cpu"
        assert state["mixed_precision"] == "bf16"
        assert state["gathered"] == [0, 1]
    assert results[0]["shard"] == [[0, 1], [4, 5]]
    assert results[1]["shard"] == [[2, 3], [6, 7]]
    assert "ACCELERATE_USE_CPU" not in os.environ  # set in the workers only


def train_one_step() -> list[float]:
    accelerator = accelerate.Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    torch.manual_seed(100 + accelerator.process_index)  # each rank its own data
    data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    weights = accelerator.unwrap_model(model).weight.detach().flatten().tolist()
    assert isinstance(weights, list)
    return weights


def test_a_training_step_keeps_the_ranks_weights_equal() -> None:
    first, second = nb_accel.notebook_launcher(train_one_step, num_processes=2)
    torch.manual_seed(0)
    initial = torch.nn.Linear(3, 1).weight.detach().flatten().tolist()
    assert first == pytest.approx(second, abs=1e-7)
    assert first != pytest.approx(initial)


def process_index_after_a_kernel_accelerator() -> int:
    return int(accelerate.Accelerator().num_processes)


def test_a_forked_worker_ignores_the_kernel_s_own_accelerate_state() -> None:
    kernel = accelerate.PartialState(cpu=True)  # one process: the kernel's own
    assert kernel.num_processes == 1
    try:
        sizes = nb_accel.notebook_launcher(
            process_index_after_a_kernel_accelerator, num_processes=2, start_method="fork"
        )
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    assert sizes == [2, 2]


def load_missing_state(folder: str) -> None:
    accelerator = accelerate.Accelerator()
    if accelerator.process_index == 1:
        accelerator.load_state(folder)


def test_a_failure_inside_accelerate_keeps_its_type_and_rank(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="folder does not exist") as caught:
        nb_accel.notebook_launcher(load_missing_state, args=(missing,), num_processes=2)
    assert "rank 1" in "\n".join(getattr(caught.value, "__notes__", []))


def test_accelerate_s_accelerator_in_a_distributed_cell() -> None:
    from nb_accel.launch.pool import WorkerPool, load_value

    pool = WorkerPool(2, cpu=True, timeout=30)
    pool.start()
    try:
        cell = (
            "import accelerate\n"
            "theirs = accelerate.Accelerator()\n"
            "[theirs.distributed_type.value, theirs.num_processes, theirs.process_index]"
        )
        done = pool.execute(cell, want_value=True)
        states = [load_value(done[rank]) for rank in sorted(done)]
    finally:
        pool.stop()
    assert states == [["MULTI_CPU", 2, 0], ["MULTI_CPU", 2, 1]]
