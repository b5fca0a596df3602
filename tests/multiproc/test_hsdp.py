"""HSDP through Accelerate's ``ParallelismConfig`` on 4 CPU ranks (gloo): FSDP2 shards within
each of 2 replica groups of 2, trains to DDP's weights step by step, holds half of the
parameters on each rank, shows the mesh and each rank's place in it, and resumes from a
``torch.distributed.checkpoint`` checkpoint bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nb_accel import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    notebook_launcher,
)

pytestmark = pytest.mark.timeout(180)

HSDP = {"dp_replicate_size": 2, "dp_shard_size": 2}


def _setup(sizes: dict[str, int], plugin: Any = None) -> tuple[Accelerator, nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes), fsdp_plugin=plugin)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _step(accelerator: Accelerator, model: nn.Module, optimizer: Any, step: int) -> None:
    inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 10))
    inputs = inputs + accelerator.process_index  # each rank's own batch
    accelerator.backward(model(inputs).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def trained(sizes: dict[str, int]) -> dict[str, Any]:
    """Three steps; the whole weights after each (on the main process), the mesh, this rank's
    place in it and how many parameter values it holds."""
    accelerator, model, optimizer = _setup(sizes)
    weights = []
    for step in range(3):
        _step(accelerator, model, optimizer, step)
        whole = accelerator.get_state_dict(model)  # DDP's are the live parameters: copied
        weights.append({name: value.clone() for name, value in whole.items()})
    mesh = accelerator.torch_device_mesh
    held = sum(getattr(p, "_local_tensor", p).numel() for p in model.parameters())
    return {
        "weights": weights,
        "mesh": (tuple(mesh.mesh_dim_names), tuple(mesh.shape)),
        "place": (accelerator.data_parallel_rank, accelerator.data_parallel_shard_rank),
        "held": held,
        "total": sum(
            p.numel() for p in nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).parameters()
        ),
    }


def test_hsdp_trains_to_ddps_weights_holding_half_of_them() -> None:
    hsdp = notebook_launcher(trained, args=(HSDP,), num_processes=4)
    ddp = notebook_launcher(trained, args=({"dp_replicate_size": 4},), num_processes=4)
    assert [r["mesh"] for r in hsdp] == [(("dp_replicate", "dp_shard"), (2, 2))] * 4
    assert [r["place"] for r in hsdp] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["place"] for r in ddp] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert all(r["held"] * 2 == r["total"] for r in hsdp)  # half of each parameter
    assert all(r["held"] == r["total"] for r in ddp)
    for sharded, replicated in zip(hsdp[0]["weights"], ddp[0]["weights"], strict=True):
        assert sharded.keys() == replicated.keys()
        for name, value in sharded.items():
            torch.testing.assert_close(value, replicated[name], rtol=1e-5, atol=1e-6)


def resumed(folder: str, save: bool) -> dict[str, torch.Tensor]:
    """Two steps then a sharded checkpoint and two more (``save``), or the checkpoint loaded
    then the same two more; the whole weights at the end."""
    plugin = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")
    accelerator, model, optimizer = _setup(HSDP, plugin)
    if save:
        for step in range(2):
            _step(accelerator, model, optimizer, step)
        accelerator.save_state(folder)
    else:
        accelerator.load_state(folder)
    for step in range(2, 4):
        _step(accelerator, model, optimizer, step)
    return accelerator.get_state_dict(model)


def test_a_sharded_hsdp_checkpoint_resumes_bit_for_bit(tmp_path: Path) -> None:
    folder = str(tmp_path / "checkpoint")
    whole = notebook_launcher(resumed, args=(folder, True), num_processes=4)[0]
    again = notebook_launcher(resumed, args=(folder, False), num_processes=4)[0]
    assert whole.keys() == again.keys()
    assert all(torch.equal(value, again[name]) for name, value in whole.items())
