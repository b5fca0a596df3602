"""DDP communication hooks from ``DistributedDataParallelKwargs``, on two gloo processes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.utils import DDPCommunicationHookType, DistributedDataParallelKwargs, set_seed


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 16, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _train(handler: DistributedDataParallelKwargs, steps: int) -> dict[str, Any]:
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
    local = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
    local.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = accelerator.process_index

    # First step: the gradients DDP hands back against the mean of each rank's own gradients.
    x, y = _batch(rank, 0)
    torch.nn.functional.mse_loss(local(x), y).backward()
    local_grads = torch.cat([p.grad.flatten() for p in local.parameters()])
    expected = accelerator.gather(local_grads[None]).mean(dim=0)
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    first = torch.cat([p.grad.flatten() for p in model.parameters()])
    optimizer.step()
    optimizer.zero_grad()

    losses = []
    for step in range(1, steps):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    hooks = model._comm_hooks
    state = hooks[0][1] if hooks else None
    return {
        "hook_name": model._get_ddp_logging_data().get("comm_hook"),
        "hooks": len(hooks),
        "state": type(state).__name__,
        "rank": getattr(state, "matrix_approximation_rank", None),
        "state_iter": getattr(state, "iter", None),
        "first": first,
        "expected": expected,
        "losses": losses,
        "weights": torch.cat([p.detach().flatten() for p in model.parameters()]),
    }


@pytest.mark.timeout(180)
def test_fp16_hook_is_registered_and_averages_gradients() -> None:
    def train(hook: Any) -> dict[str, Any]:
        return _train(DistributedDataParallelKwargs(comm_hook=hook), steps=30)

    plain = notebook_launcher(train, args=(DDPCommunicationHookType.NO,), num_processes=2)
    fp16 = notebook_launcher(train, args=("fp16",), num_processes=2)
    for result in fp16:
        assert result["hook_name"] == "fp16_compress_hook"
        assert result["hooks"] == 1
        torch.testing.assert_close(result["first"], result["expected"], rtol=2e-3, atol=1e-3)
        assert _mean(result["losses"][-5:]) < _mean(result["losses"][:5]) / 2
    assert not plain[0]["hooks"] and plain[0]["hook_name"] != "fp16_compress_hook"
    torch.testing.assert_close(fp16[0]["first"], plain[0]["first"], rtol=2e-3, atol=1e-3)
    # Both ranks end with the same weights: the hook's average reached each of them.
    torch.testing.assert_close(fp16[0]["weights"], fp16[1]["weights"], rtol=0, atol=0)


@pytest.mark.timeout(180)
def test_power_sgd_hook_takes_its_state_options_and_trains() -> None:
    def train() -> dict[str, Any]:
        handler = DistributedDataParallelKwargs(
            comm_hook=DDPCommunicationHookType.POWER_SGD,
            comm_wrapper=DDPCommunicationHookType.FP16,
            comm_state_option={"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
        )
        return _train(handler, steps=30)

    results = notebook_launcher(train, num_processes=2)
    for result in results:
        assert result["hooks"] == 1
        assert "fp16_compress_wrapper" in result["hook_name"]
        assert result["state"] == "PowerSGDState"
        assert result["rank"] == 1
        assert result["state_iter"] >= 2
        assert _mean(result["losses"][-5:]) < _mean(result["losses"][:5]) / 2
    torch.testing.assert_close(results[0]["weights"], results[1]["weights"], rtol=0, atol=0)


def test_hook_settings_are_checked_and_kept_out_of_the_ddp_options() -> None:
    handler = DistributedDataParallelKwargs(comm_hook="bf16", static_graph=True)
    assert handler.comm_hook is DDPCommunicationHookType.BF16
    assert handler.to_dict()["static_graph"] is True
    assert "comm_hook" not in handler.to_dict()
    assert handler.to_kwargs() == {"static_graph": True, "comm_hook": DDPCommunicationHookType.BF16}
    with pytest.raises(ValueError, match="comm_wrapper='power_sgd' is not a wrapper"):
        DistributedDataParallelKwargs(comm_wrapper="power_sgd")
    with pytest.raises(ValueError, match="'fp8' is not a valid"):
        DistributedDataParallelKwargs(comm_hook="fp8")
