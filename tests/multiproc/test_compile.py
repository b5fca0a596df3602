"""``torch.compile`` through ``Accelerator(dynamo_backend=...)`` / ``TorchDynamoPlugin``, in two
forked gloo processes: the same training as without it, the original model and plain keys back."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from nb_accel import Accelerator, TorchDynamoPlugin, notebook_launcher
from nb_accel.utils import set_seed

needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="inductor generates C++ on the CPU and no C++ compiler (g++) is installed",
)


@pytest.fixture(autouse=True)
def _compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's generated code goes to the test's folder, not the machine's /tmp."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile_cache"))


class Net(torch.nn.Module):
    """A model of the user's own class (torch compiles its forward inside DDP's)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(6, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


def _model(kind: str) -> torch.nn.Module:
    if kind == "sequential":
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return Net()


def _train(options: dict[str, Any], kind: str, folder: str) -> dict[str, Any]:
    from safetensors.torch import load_file
    from torch._dynamo.utils import counters

    accelerator = Accelerator(cpu=True, **options)
    set_seed(0)
    model = _model(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = accelerator.process_index
    losses = []
    for step in range(4):
        generator = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(5, 6, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    ddp = model if isinstance(model, DistributedDataParallel) else model._orig_mod
    with accelerator.no_sync(model):
        no_sync_reaches_ddp = ddp.require_backward_grad_sync is False
    accelerator.save_state(os.path.join(folder, "state"))
    accelerator.save_model(model, os.path.join(folder, "model"))
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    saved = {k: v.detach().clone() for k, v in unwrapped.state_dict().items()}
    accelerator.backward(model(torch.ones(5, 6)).sum())
    optimizer.step()
    accelerator.load_state(os.path.join(folder, "state"))
    restored = all(torch.equal(v, saved[k]) for k, v in unwrapped.state_dict().items())
    kept = accelerator.unwrap_model(model, keep_torch_compile=True)
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "unwrapped": type(unwrapped).__name__,
        "kept": type(kept).__name__,
        "kept_inner": type(getattr(kept, "_orig_mod", kept)).__name__,
        "state_dict_keys": sorted(accelerator.get_state_dict(model)),
        "state_keys": sorted(load_file(os.path.join(folder, "state", "model.safetensors"))),
        "model_keys": sorted(load_file(os.path.join(folder, "model", "model.safetensors"))),
        "weights": saved,
        "restored": restored,
        "losses": losses,
        "plugin": accelerator.state.dynamo_plugin.to_dict(),
        "no_sync": no_sync_reaches_ddp,
    }


def _run(options: dict[str, Any], kind: str, folder: Path) -> list[dict[str, Any]]:
    folder.mkdir()
    return notebook_launcher(_train, args=(options, kind, str(folder)), num_processes=2)


def _assert_same_training(compiled: list[dict[str, Any]], eager: list[dict[str, Any]]) -> None:
    for with_compile, without in zip(compiled, eager, strict=True):
        assert with_compile["no_sync"] and without["no_sync"]
        assert with_compile["restored"] and without["restored"]
        torch.testing.assert_close(with_compile["losses"], without["losses"], rtol=1e-5, atol=1e-5)
        assert with_compile["weights"].keys() == without["weights"].keys()
        for name, value in with_compile["weights"].items():
            torch.testing.assert_close(value, without["weights"][name], rtol=1e-5, atol=1e-5)


def _assert_plain_keys(results: list[dict[str, Any]], expected: list[str]) -> None:
    for result in results:
        assert result["state_dict_keys"] == expected
        assert result["state_keys"] == expected
        assert result["model_keys"] == expected


@needs_compiler
@pytest.mark.timeout(300)
def test_inductor_trains_like_eager_and_unwraps_to_the_original_model(tmp_path: Path) -> None:
    eager = _run({}, "net", tmp_path / "eager")
    compiled = _run({"dynamo_backend": "inductor"}, "net", tmp_path / "inductor")
    assert eager[0]["graphs"] == 0
    assert all(result["graphs"] > 0 for result in compiled)  # inductor really compiled
    _assert_same_training(compiled, eager)
    _assert_plain_keys(compiled, ["hidden.bias", "hidden.weight", "out.bias", "out.weight"])
    assert {r["unwrapped"] for r in compiled} == {"Net"}
    assert {(r["kept"], r["kept_inner"]) for r in compiled} == {("OptimizedModule", "Net")}
    assert compiled[0]["plugin"]["backend"] == "inductor"


@pytest.mark.timeout(300)
def test_plugin_with_fullgraph_compiles_a_sequential_model(tmp_path: Path) -> None:
    plugin = TorchDynamoPlugin(backend="aot_eager", fullgraph=True, dynamic=False)
    eager = _run({}, "sequential", tmp_path / "eager")
    compiled = _run({"dynamo_plugin": plugin}, "sequential", tmp_path / "aot_eager")
    assert all(result["graphs"] > 0 for result in compiled)
    _assert_same_training(compiled, eager)
    _assert_plain_keys(compiled, ["0.bias", "0.weight", "2.bias", "2.weight"])
    assert {r["unwrapped"] for r in compiled} == {"Sequential"}
    assert {(r["kept"], r["kept_inner"]) for r in compiled} == {("OptimizedModule", "Sequential")}
    assert compiled[0]["plugin"]["fullgraph"] is True


@pytest.mark.timeout(300)
def test_accelerate_environment_variable_chooses_the_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "AOT_EAGER")
    compiled = _run({}, "net", tmp_path / "env")
    assert all(result["graphs"] > 0 for result in compiled)
    assert compiled[0]["plugin"]["backend"] == "aot_eager"
