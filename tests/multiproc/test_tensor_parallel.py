"""Tensor parallelism through Accelerate's ``ParallelismConfig`` on CPU ranks (gloo): a model
parallelised with torch's ``parallelize_module`` over ``accelerator.torch_device_mesh["tp"]``,
alone or with FSDP2 over the data dimension (2 x 2), trains to DDP's weights step by step; the
ranks of a tp group see the same batches, ``gather_for_metrics`` gives each sample once; each
rank holds its part of the parameters; torch's advice to flatten the mesh is held back; a
``torch.distributed.checkpoint`` checkpoint resumes bit for bit, the learning rate its scheduler
changed with it; a model that is not parallelised, or over another size, is refused."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset

from nb_accel import (
    Accelerator,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    notebook_launcher,
)

pytestmark = pytest.mark.timeout(240)

TP_X_DP = {"tp_size": 2, "dp_shard_size": 2}
STEPS = 4
BATCH = 2  # per data-parallel place
#: The parameters the plan splits across the tp ranks (the norm and the last bias stay whole).
SPLIT = {"up.weight", "up.bias", "down.weight"}


class Net(nn.Module):
    """A norm (replicated), then a column-wise and a row-wise linear layer (tensor parallel)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(32, 8, generator=generator), torch.randn(32, 4, generator=generator)
    )


def _parts(sizes: dict[str, int], plugin: Any = None) -> tuple[Accelerator, nn.Module, Any, Any]:
    """The accelerator, the model (parallelised where ``tp_size`` says), its optimizer and the
    loader, not prepared yet."""
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes), fsdp_plugin=plugin)
    torch.manual_seed(1)
    model = Net()
    if sizes.get("tp_size", 1) > 1:
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        parallelize_module(model, accelerator.torch_device_mesh["tp"], plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    return accelerator, model, optimizer, DataLoader(_data(), batch_size=BATCH)


def _setup(sizes: dict[str, int], plugin: Any = None) -> tuple[Accelerator, nn.Module, Any, Any]:
    accelerator, *parts = _parts(sizes, plugin)
    return accelerator, *accelerator.prepare(*parts)


def _torch_logs_to_stderr() -> None:
    """Point torch's log handlers at this worker's stderr, which the launch relays to the
    kernel (where ``capfd`` reads it), as a worker started from a terminal would write them.
    torch made them when it was imported, on the stderr of that moment: in a test, pytest's
    capture file, which the forked workers inherit and no test reads."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] == "torch":
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler:
                    handler.setStream(sys.stderr)


def _step(accelerator: Accelerator, model: nn.Module, optimizer: Any, batch: Any) -> None:
    inputs, targets = batch
    accelerator.backward(nn.functional.mse_loss(model(inputs), targets))
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


def trained(sizes: dict[str, int]) -> dict[str, Any]:
    """``STEPS`` steps; the whole weights after each (on the main process), the batches this
    rank saw, how many parameter values it holds, and the samples ``gather_for_metrics``
    gives back from an evaluation pass."""
    _torch_logs_to_stderr()
    accelerator, model, optimizer, loader = _setup(sizes)
    weights, seen = [], []
    for step, batch in enumerate(loader):
        if step == STEPS:
            break
        seen.append(batch[0].sum().item())
        _step(accelerator, model, optimizer, batch)
        whole = accelerator.get_state_dict(model)
        weights.append({name: value.clone() for name, value in whole.items()})
    numbered = DataLoader(TensorDataset(torch.arange(10)), batch_size=BATCH)
    samples = [accelerator.gather_for_metrics(b[0]) for b in accelerator.prepare(numbered)]
    return {
        "weights": weights,
        "seen": seen,
        "held": {n: getattr(p, "_local_tensor", p).numel() for n, p in model.named_parameters()},
        "samples": torch.cat(samples).tolist(),
        "place": (accelerator.tensor_parallel_rank, accelerator.data_parallel_shard_rank),
    }


def _single_process() -> list[dict[str, torch.Tensor]]:
    """The same training in this process, one batch of one place per step."""
    torch.manual_seed(1)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    weights = []
    for step, (inputs, targets) in enumerate(DataLoader(_data(), batch_size=BATCH)):
        if step == STEPS:
            break
        nn.functional.mse_loss(model(inputs), targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        weights.append({name: value.detach().clone() for name, value in model.state_dict().items()})
    return weights


def _assert_same_weights(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> None:
    assert len(ours) == len(theirs) == STEPS
    for mine, reference in zip(ours, theirs, strict=True):  # step by step
        assert mine.keys() == reference.keys()
        for name, value in mine.items():
            torch.testing.assert_close(value, reference[name], rtol=1e-5, atol=1e-6)


def test_tp_with_fsdp_trains_to_ddps_weights_holding_a_quarter(
    capfd: pytest.CaptureFixture[str],
) -> None:
    parallel = notebook_launcher(trained, args=(TP_X_DP,), num_processes=4)
    # clipping and whole weights gather 2-D DTensors: torch's advice on the mesh is not shown
    err = capfd.readouterr().err
    assert "sequential" not in err and "flatten mesh" not in err, err
    ddp = notebook_launcher(trained, args=({"dp_replicate_size": 2},), num_processes=2)
    _assert_same_weights(parallel[0]["weights"], ddp[0]["weights"])
    assert [r["place"] for r in parallel] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    # the ranks of a tp group see the same batches; the two data-parallel places, DDP's
    assert parallel[0]["seen"] == parallel[1]["seen"] == ddp[0]["seen"]
    assert parallel[2]["seen"] == parallel[3]["seen"] == ddp[1]["seen"] != ddp[0]["seen"]
    whole = {n: p.numel() for n, p in Net().named_parameters()}
    for result in parallel:  # split parameters: 1/4 each; the others sharded by FSDP only: 1/2
        assert result["held"] == {n: size // (4 if n in SPLIT else 2) for n, size in whole.items()}
    for result in parallel:  # every sample once, as DDP's two ranks give them
        assert result["samples"] == ddp[0]["samples"] == list(range(10))


def test_tp_with_hsdp_trains_to_ddps_weights() -> None:
    """3-D: 2 replicas x 2 FSDP shards x 2 tensor parallel ranks, against DDP over the same 4
    data-parallel places."""
    layout = {"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2}
    parallel = notebook_launcher(trained, args=(layout,), num_processes=8)
    ddp = notebook_launcher(trained, args=({"dp_replicate_size": 4},), num_processes=4)
    _assert_same_weights(parallel[0]["weights"], ddp[0]["weights"])
    assert [r["seen"] for r in parallel[::2]] == [r["seen"] for r in ddp]
    assert all(r["samples"] == list(range(10)) for r in parallel)


def test_tp_alone_trains_to_one_process_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # AdamW here sets it otherwise
    parallel = notebook_launcher(trained, args=({"tp_size": 2},), num_processes=2)
    _assert_same_weights(parallel[0]["weights"], _single_process())
    assert parallel[0]["seen"] == parallel[1]["seen"]  # one group: every rank the same batches
    whole = {n: p.numel() for n, p in Net().named_parameters()}
    assert parallel[1]["held"] == {n: size // (2 if n in SPLIT else 1) for n, size in whole.items()}
    assert parallel[1]["samples"] == list(range(10))


def resumed(folder: str, sizes: dict[str, int], save: bool) -> dict[str, Any]:
    """Two steps then a sharded checkpoint and two more (``save``), or the checkpoint loaded
    then the same two more; a scheduler, prepared (so saved and loaded with the rest), lowers
    the learning rate at each step. The whole weights and the learning rate at the end."""
    plugin = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")
    accelerator, model, optimizer, loader = _parts(
        sizes, plugin if "dp_shard_size" in sizes else None
    )
    # each step multiplies the optimizer's own lr: one not restored stays wrong to the end
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, schedule)
    batches = list(loader)
    if save:
        for batch in batches[:2]:
            _step(accelerator, model, optimizer, batch)
            scheduler.step()
        accelerator.save_state(folder)
    else:
        accelerator.load_state(folder)
    for batch in batches[2:4]:
        _step(accelerator, model, optimizer, batch)
        scheduler.step()
    lr = [group["lr"] for group in optimizer.param_groups]
    return {"weights": accelerator.get_state_dict(model), "lr": lr}


@pytest.mark.parametrize("sizes", [TP_X_DP, {"tp_size": 2}], ids=["tp-x-fsdp", "tp"])
def test_a_tensor_parallel_checkpoint_resumes_bit_for_bit(
    tmp_path: Path, sizes: dict[str, int]
) -> None:
    folder = str(tmp_path / "checkpoint")
    processes = sizes.get("tp_size", 1) * sizes.get("dp_shard_size", 1)
    whole = notebook_launcher(resumed, args=(folder, sizes, True), num_processes=processes)[0]
    again = notebook_launcher(resumed, args=(folder, sizes, False), num_processes=processes)[0]
    assert whole["lr"][0] < 0.05 * 0.8**3  # the scheduler lowered it at each of the 4 steps
    assert again["lr"] == whole["lr"]  # the optimizer's param_groups came back with its state
    assert whole["weights"].keys() == again["weights"].keys()
    assert all(torch.equal(value, again["weights"][n]) for n, value in whole["weights"].items())
    assert any((tmp_path / "checkpoint").glob("pytorch_model_fsdp_0*")), "not written sharded"


def not_parallelised(recorded_tp_size: int | None) -> None:
    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    model = Net()
    if recorded_tp_size is not None:  # as transformers records it
        parallelize_module(model, accelerator.torch_device_mesh["tp"], {"up": ColwiseParallel()})
        model.tp_size = recorded_tp_size  # type: ignore[assignment]
    accelerator.prepare(model)


def test_a_model_that_is_not_tensor_parallel_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tp_size=2\), but Net is not tensor parallel"):
        notebook_launcher(not_parallelised, args=(None,), num_processes=2)


def test_a_model_parallelised_over_another_size_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"ParallelismConfig \(2\) should be the same as the model's tp size \(4\)"
    ):
        notebook_launcher(not_parallelised, args=(4,), num_processes=2)


def _tiny_llama(folder: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    LlamaForCausalLM(config).save_pretrained(folder)


def _llama_losses(model: nn.Module, backward: Any, optimizer: Any) -> list[float]:
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def llama_with_its_own_plan(folder: str) -> list[float]:
    from transformers import AutoModelForCausalLM, DistributedConfig

    accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    plan = DistributedConfig(tp_plan="auto")  # transformers' own plan for the model
    model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return _llama_losses(model, accelerator.backward, optimizer)


def llama_alone(folder: str) -> list[float]:
    """The tiny model written, then trained in one process (kept out of the test's own: the
    libraries leave threads and variables behind)."""
    from transformers import AutoModelForCausalLM

    _tiny_llama(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return _llama_losses(model, lambda loss: loss.backward(), optimizer)


def test_a_transformers_model_with_its_own_tp_plan_trains_as_on_one_process(
    tmp_path: Path,
) -> None:
    folder = str(tmp_path / "llama")
    alone = notebook_launcher(llama_alone, args=(folder,), num_processes=1)[0]
    parallel = notebook_launcher(llama_with_its_own_plan, args=(folder,), num_processes=2)
    assert parallel[0] == parallel[1]
    torch.testing.assert_close(torch.tensor(parallel[0]), torch.tensor(alone), rtol=1e-5, atol=1e-6)


def the_launchs_mesh() -> tuple[Any, ...]:
    accelerator = Accelerator()  # nothing given: the launch's mesh, as under accelerate launch
    mesh = accelerator.torch_device_mesh
    return tuple(mesh.mesh_dim_names), tuple(mesh.shape), accelerator.is_fsdp2


def test_the_launch_lays_out_the_mesh_a_bare_accelerator_builds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    layout = ParallelismConfig(tp_size=2, dp_shard_size=2)
    found = notebook_launcher(the_launchs_mesh, num_processes=4, parallelism_config=layout)
    assert found == [(("dp_shard", "tp"), (2, 2), True)] * 4
    assert (
        "Launching 4 processes on CPU (gloo; fork, mesh dp_shard 2 x tp 2)"
        in capsys.readouterr().out
    )


def test_the_pool_lays_out_its_mesh_for_the_cells() -> None:
    from nb_accel.launch.pool import WorkerPool
    from nb_accel.launch.pool_ranks.values import load_value

    pool = WorkerPool(4, cpu=True, parallelism_config={"tp_size": 2, "dp_shard_size": 2})
    try:
        pool.start(notes=False)
        assert pool.describe() == "4 processes on CPU (gloo; fork, mesh dp_shard 2 x tp 2)"
        done = pool.execute(
            "from nb_accel import Accelerator\nshape = Accelerator().torch_device_mesh.shape\n"
            "tuple(shape)",
            want_value=True,
        )
        assert [load_value(reply) for _, reply in sorted(done.items())] == [(2, 2)] * 4
    finally:
        pool.stop()
