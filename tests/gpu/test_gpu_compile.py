"""``torch.compile`` and ``InitProcessGroupKwargs`` on GPUs with NCCL (skipped without two CUDA
GPUs): inductor trains like eager, and the handler's timeout bounds NCCL's collectives."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from nb_accel import (
    Accelerator,
    CollectiveTimeoutError,
    InitProcessGroupKwargs,
    notebook_launcher,
)
from nb_accel.runtime.device_types import cuda_facts
from nb_accel.utils import set_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_facts.cuda_device_count() < 2, reason="needs two CUDA GPUs"),
]


@pytest.fixture(autouse=True)
def _compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's and Triton's generated code goes to the test's folder."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor_cache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))


class Net(torch.nn.Module):
    """A small model of the user's own class."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


def train(options: dict[str, Any]) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch.backends.cuda.matmul.allow_tf32 = False  # compare like with like
    accelerator = Accelerator(**options)
    set_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for step in range(4):
        generator = torch.Generator().manual_seed(10 * step + accelerator.process_index)
        x = torch.randn(8, 16, generator=generator).to(accelerator.device)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    unwrapped = accelerator.unwrap_model(model)
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "unwrapped": type(unwrapped).__name__,
        "keys": sorted(accelerator.get_state_dict(model)),
        "weights": {k: v.detach().cpu() for k, v in unwrapped.state_dict().items()},
        "losses": losses,
    }


@pytest.mark.timeout(600)
def test_inductor_on_gpus_trains_like_eager() -> None:
    eager = notebook_launcher(train, args=({},), num_processes=2)
    compiled = notebook_launcher(train, args=({"dynamo_backend": "inductor"},), num_processes=2)
    for with_compile, without in zip(compiled, eager, strict=True):
        assert with_compile["graphs"] > 0 and with_compile["unwrapped"] == "Net"
        assert with_compile["keys"] == ["hidden.bias", "hidden.weight", "out.bias", "out.weight"]
        torch.testing.assert_close(with_compile["losses"], without["losses"], rtol=1e-4, atol=1e-5)
        for name, value in with_compile["weights"].items():
            torch.testing.assert_close(value, without["weights"][name], rtol=1e-4, atol=1e-5)


def rank_one_arrives_late() -> float:
    import torch.distributed as dist

    handler = InitProcessGroupKwargs(timeout=timedelta(seconds=10))
    accelerator = Accelerator(kwargs_handlers=[handler])
    value = torch.ones(1, device=accelerator.device)
    dist.all_reduce(value)
    if accelerator.process_index == 1:
        time.sleep(120)  # stopped long before: rank 0's watchdog gives up after 10 s
    dist.all_reduce(value)
    return value.item()


@pytest.mark.timeout(300)
def test_the_handlers_timeout_bounds_nccl_collectives() -> None:
    with pytest.raises(CollectiveTimeoutError):
        notebook_launcher(rank_one_arrives_late, num_processes=2, timeout=600)
