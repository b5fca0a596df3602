"""FSDP2 through prepare() on real worker groups (gloo): the same training as DDP, 1/N of the
state on each rank, and clear errors for what cannot work."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fsdp_models import Net, loader, local_numel

from nb_accel import Accelerator, DistributedType, FullyShardedDataParallelPlugin, notebook_launcher
from nb_accel.utils import set_seed

pytestmark = pytest.mark.timeout(240)


def train(fsdp: bool, options: dict[str, Any]) -> dict[str, Any]:
    """Two epochs of AdamW; the losses, clipped norms, final whole weights and gathered
    evaluation outputs."""
    plugin = None
    if fsdp:
        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
        )
    accelerator = Accelerator(
        fsdp_plugin=plugin,
        mixed_precision=options.get("mixed_precision", "no"),
        gradient_accumulation_steps=options.get("accumulate", 1),
    )
    set_seed(5 + accelerator.process_index)  # different initial weights: rank 0's are used
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    data, evaluation = loader(), loader(batch_size=5)
    model, optimizer, data, scheduler, evaluation = accelerator.prepare(
        model, optimizer, data, scheduler, evaluation
    )
    losses, norms = [], []
    for _ in range(2):
        for x, y in data:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
                accelerator.backward(loss)
                if options.get("clip") and accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.3)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append(float(accelerator.reduce(loss.detach(), "mean")))
    outputs = []
    model.eval()
    with torch.no_grad():
        for x, _ in evaluation:
            outputs.append(accelerator.gather_for_metrics(model(x).float()))
    weights = accelerator.get_state_dict(model)
    return {
        "type": accelerator.distributed_type,
        "is_fsdp2": accelerator.is_fsdp2,
        "losses": losses,
        "norms": norms,
        "weights": {k: v.float().clone() for k, v in weights.items()},
        "outputs": torch.cat(outputs),
    }


CASES = {
    "fp32": (2, {}, 1e-5),
    "fp32-3-ranks-accumulate-clip": (3, {"accumulate": 2, "clip": True}, 1e-5),
    "bf16-accumulate-clip": (2, {"mixed_precision": "bf16", "accumulate": 2, "clip": True}, 2e-2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fsdp_trains_as_ddp_does(case: str) -> None:
    processes, options, tolerance = CASES[case]
    ddp = notebook_launcher(train, (False, options), processes, show_progress=False)
    fsdp = notebook_launcher(train, (True, options), processes, show_progress=False)
    assert ddp[0]["type"] == DistributedType.MULTI_CPU and not ddp[0]["is_fsdp2"]
    assert all(r["type"] == DistributedType.FSDP and r["is_fsdp2"] for r in fsdp)
    torch.testing.assert_close(
        torch.tensor(fsdp[0]["losses"]), torch.tensor(ddp[0]["losses"]), atol=tolerance, rtol=0
    )
    if options.get("clip"):
        assert len(fsdp[0]["norms"]) == len(ddp[0]["norms"]) > 0
        assert max(fsdp[0]["norms"]) > 0.3  # clipping took place
        torch.testing.assert_close(
            torch.tensor(fsdp[0]["norms"]), torch.tensor(ddp[0]["norms"]), atol=tolerance, rtol=0
        )
        for rank in fsdp[1:]:  # the same norm on every rank
            assert rank["norms"] == fsdp[0]["norms"]
    assert set(fsdp[0]["weights"]) == set(ddp[0]["weights"])
    for name, value in ddp[0]["weights"].items():
        torch.testing.assert_close(fsdp[0]["weights"][name], value, atol=tolerance, rtol=0)
    assert all(rank["weights"] == {} for rank in fsdp[1:])  # gathered to the main process only
    torch.testing.assert_close(fsdp[0]["outputs"], ddp[0]["outputs"], atol=tolerance, rtol=0)
    assert fsdp[0]["outputs"].shape[0] == 96  # gather_for_metrics drops the padding, as in DDP


def shard_sizes() -> dict[str, Any]:
    """What this rank holds of the parameters and of AdamW's state after one step."""
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model = Net()
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(4, 7)
    accelerator.backward(model(x).pow(2).mean())
    optimizer.step()
    state = [v for s in optimizer.state.values() for k, v in s.items() if k != "step"]
    return {
        "total": total,
        "params": sum(local_numel(p) for p in model.parameters()),
        "grads": sum(local_numel(p.grad) for p in model.parameters() if p.grad is not None),
        "optimizer": sum(local_numel(v) for v in state),
        "rows": [tuple(p.to_local().shape) for p in model.parameters()],
    }


@pytest.mark.parametrize("processes", [2, 3])
def test_each_rank_holds_one_nth_of_the_state(processes: int) -> None:
    sizes = notebook_launcher(shard_sizes, (), processes, show_progress=False)
    total = sizes[0]["total"]
    assert sum(s["params"] for s in sizes) == total  # every element held exactly once
    rows = Net().parameters()
    bound = sum(-(-p.shape[0] // processes) * (p.numel() // p.shape[0]) for p in rows)
    for size in sizes:
        assert size["params"] <= bound < total * 0.75  # 1/N, plus rounding of uneven rows
        assert size["grads"] == size["params"]
        assert size["optimizer"] == 2 * size["params"]  # AdamW's two moments, sharded too


def optimizer_first() -> None:
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model = Net()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.prepare(model)
    del optimizer


def prepared_apart_and_reversed() -> list[bool]:
    """The optimizer prepared in a later call, or before the model in the same call."""
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    first, second = Net(), Net()
    opt_first = torch.optim.SGD(first.parameters(), lr=0.1)
    opt_second = torch.optim.SGD(second.parameters(), lr=0.1)
    first = accelerator.prepare(first)
    opt_first = accelerator.prepare(opt_first)
    opt_second, second = accelerator.prepare(opt_second, second)
    on_shards = []
    for model, optimizer in ((first, opt_first), (second, opt_second)):
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        on_shards.append(held == {id(p) for p in model.parameters()})
    return on_shards


def missing_layer_class() -> None:
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Decoder"]
    )
    Accelerator(fsdp_plugin=plugin).prepare(Net())


def test_the_optimizer_follows_the_shards_when_prepared_with_or_after_the_model() -> None:
    assert notebook_launcher(prepared_apart_and_reversed, (), 2, show_progress=False) == [
        [True, True],
        [True, True],
    ]


def test_an_optimizer_prepared_before_its_model_is_an_error() -> None:
    with pytest.raises(ValueError, match="prepared before its model") as caught:
        notebook_launcher(optimizer_first, (), 2, show_progress=False)
    assert "accelerator.prepare(model, optimizer)" in str(caught.value)


def test_a_wrap_policy_naming_a_missing_class_is_an_error() -> None:
    with pytest.raises(ValueError, match="does not contain") as caught:
        notebook_launcher(missing_layer_class, (), 2, show_progress=False)
    assert "Block" in str(caught.value)  # the classes the model has


def overflow_on_one_shard() -> dict[str, Any]:
    """fp16: a gradient overflows in the last rows of a weight, which only the last rank's shard
    holds after the reduce-scatter; every rank must skip that step."""
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), mixed_precision="fp16")
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    skipped = []
    for step in range(3):
        loss = model(torch.randn(4, 7)).float().pow(2).mean()
        accelerator.backward(loss)
        if step == 1:
            grad = model.head.weight.grad
            local = grad.to_local()
            if accelerator.process_index == accelerator.num_processes - 1:
                local[-1].fill_(float("inf"))
        optimizer.step()
        optimizer.zero_grad()
        skipped.append(accelerator.optimizer_step_was_skipped)
    return {"skipped": skipped, "scale": float(accelerator.scaler.get_scale())}


def test_an_fp16_overflow_in_one_shard_skips_the_step_on_every_rank() -> None:
    results = notebook_launcher(overflow_on_one_shard, (), 2, show_progress=False)
    assert [r["skipped"] for r in results] == [[False, True, False]] * 2
    assert results[0]["scale"] == results[1]["scale"]


def mixed_dtypes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).half())
    Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()).prepare(model)


def test_a_model_that_cannot_be_sharded_is_an_error_before_any_collective() -> None:
    with pytest.raises(ValueError, match="different dtypes") as caught:
        notebook_launcher(mixed_dtypes, (), 2, show_progress=False)
    assert "ignored_modules" in str(caught.value) and "float16, float32" in str(caught.value)


def return_shards() -> Any:
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    model = accelerator.prepare(Net())
    return {"weights": model.state_dict()}


def return_sharded_model() -> Any:
    return Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()).prepare(Net())


def test_returning_shards_is_refused_with_what_to_return_instead() -> None:
    with pytest.raises(TypeError, match=r"returned a DTensor \(at result\['weights'\]") as caught:
        notebook_launcher(return_shards, (), 2, show_progress=False)
    assert "full_tensor()" in str(caught.value)
    with pytest.raises(TypeError, match="FSDPNet, which only works inside its worker") as caught:
        notebook_launcher(return_sharded_model, (), 2, show_progress=False)
    assert "accelerator.get_state_dict(model)" in str(caught.value)
