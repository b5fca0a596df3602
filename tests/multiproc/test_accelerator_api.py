"""The Accelerator's API on two real processes: prepare, accumulation, scheduler, processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from markers import touch_when_waiting, wait_until
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from nb_accel import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    Accelerator,
    DataLoaderShard,
    notebook_launcher,
)
from nb_accel.utils import DataLoaderConfiguration, GradientAccumulationPlugin


def check_prepare() -> dict[str, object]:
    accelerator = Accelerator()
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)
    loader = DataLoader(list(range(10)), batch_size=2)
    # Any order; the scheduler before its optimizer on purpose.
    p_sched, p_loader, p_model, p_opt = accelerator.prepare(scheduler, loader, model, optimizer)
    again = accelerator.prepare(p_model, p_opt, p_sched, p_loader)
    return {
        "types": [type(o).__name__ for o in (p_sched, p_loader, p_model, p_opt)],
        "idempotent": all(
            a is b for a, b in zip(again, (p_model, p_opt, p_sched, p_loader), strict=False)
        ),
        "unwrapped_is_original": accelerator.unwrap_model(p_model) is model,
        "scheduler_follows": p_sched.optimizers == [p_opt],
        "len": len(p_loader),
    }


def test_prepare_wraps_everything_in_any_order() -> None:
    for result in notebook_launcher(check_prepare, num_processes=2):
        assert result["types"] == [
            AcceleratedScheduler.__name__,
            DataLoaderShard.__name__,
            DistributedDataParallel.__name__,
            AcceleratedOptimizer.__name__,
        ]
        assert result["idempotent"] and result["unwrapped_is_original"]
        assert result["scheduler_follows"] and result["len"] == 3


def sync_pattern() -> dict[str, object]:
    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    model = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loader = DataLoader(torch.arange(10, dtype=torch.float32).unsqueeze(1), batch_size=1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    pattern, grads_equal = [], []
    for x in loader:  # 5 batches per rank
        with accelerator.accumulate(model):
            accelerator.backward(model(x).sum())
            pattern.append(accelerator.sync_gradients)
            grad = model.module.weight.grad.clone()
            gathered = accelerator.gather(grad.reshape(1))
            grads_equal.append(bool(gathered[0] == gathered[1]))
            optimizer.step()
            optimizer.zero_grad()
    return {"pattern": pattern, "grads_equal": grads_equal}


def test_accumulation_syncs_every_n_steps_and_at_the_end() -> None:
    for result in notebook_launcher(sync_pattern, num_processes=2):
        assert result["pattern"] == [False, True, False, True, True]
        # Ranks hold different local gradients until a synchronising step all-reduces them.
        assert result["grads_equal"] == [False, True, False, True, True]


def scheduler_steps(split: bool) -> list[int]:
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split))
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    seen = []
    for _ in range(3):
        optimizer.step()
        scheduler.step()
        seen.append(scheduler.scheduler.last_epoch)
    return seen


@pytest.mark.parametrize("split, expected", [(False, [2, 4, 6]), (True, [1, 2, 3])])
def test_scheduler_steps_once_per_process_unless_batches_are_split(
    split: bool, expected: list[int]
) -> None:
    assert notebook_launcher(scheduler_steps, args=(split,), num_processes=2) == [expected] * 2


def triggers_and_decorators() -> dict[str, object]:
    accelerator = Accelerator()
    before = accelerator.check_trigger()
    if accelerator.process_index == 1:
        accelerator.set_trigger()
    after = accelerator.check_trigger()
    reset = accelerator.check_trigger()

    @accelerator.on_main_process
    def main_only() -> str:
        return "main"

    @accelerator.on_process(process_index=1)
    def second_only() -> str:
        return "second"

    with accelerator.split_between_processes(list(range(5))) as share:
        mine = share
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), reduction="sum")
    return {
        "triggers": (before, after, reset),
        "decorated": (main_only(), second_only()),
        "share": mine,
        "reduced": total.item(),
        "flags": (accelerator.is_main_process, accelerator.is_local_main_process),
    }


def test_triggers_decorators_and_splitting() -> None:
    first, second = notebook_launcher(triggers_and_decorators, num_processes=2)
    assert first["triggers"] == second["triggers"] == (False, True, False)
    assert first["decorated"] == ("main", None) and second["decorated"] == (None, "second")
    assert first["share"] == [0, 1, 2] and second["share"] == [3, 4]
    assert first["reduced"] == second["reduced"] == 3.0
    assert first["flags"] == (True, True) and second["flags"] == (False, False)


def ordered_work(folder: str) -> float:
    """The main process writes its marker only once every other rank waits to enter the block
    (or, were it not made to wait, is inside it and has looked for the marker already)."""
    accelerator = Accelerator()
    where, rank = Path(folder), accelerator.process_index
    marker = where / "main-done"
    if not accelerator.is_main_process:
        touch_when_waiting(where / f"rank{rank}-waiting")
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            others = range(1, accelerator.num_processes)
            wait_until(
                lambda: all(
                    (where / f"rank{r}-waiting").exists() or (where / f"rank{r}-inside").exists()
                    for r in others
                ),
                "the other ranks at the block",
            )
            marker.write_text("ready")
            return float(marker.exists())
        seen = marker.exists()  # written before the others may enter
        (where / f"rank{rank}-inside").touch()
        return float(seen)


def test_main_process_first_runs_main_before_the_others(tmp_path: Path) -> None:
    assert notebook_launcher(ordered_work, args=(str(tmp_path),), num_processes=3) == [1.0] * 3


class DownloadFailed(Exception):
    """Raised on the main process inside main_process_first."""


def main_fails_first() -> None:
    accelerator = Accelerator()
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            raise DownloadFailed("dataset mirror unreachable")


def test_main_process_first_failure_reaches_the_caller_not_a_timeout() -> None:
    with pytest.raises(DownloadFailed, match="mirror unreachable"):
        notebook_launcher(main_fails_first, num_processes=2, timeout=300)


def bf16_forward() -> tuple[str, str, str]:
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    seen = []
    model.module[0].register_forward_hook(lambda m, i, o: seen.append(str(o.dtype)))
    out = model(torch.randn(2, 4))
    with accelerator.autocast():
        inside = (torch.randn(2, 4) @ torch.randn(4, 4)).dtype
    return seen[0], str(out.dtype), str(inside)


def test_bf16_runs_the_forward_in_bf16_and_returns_fp32() -> None:
    for inner, outer, inside in notebook_launcher(
        bf16_forward, num_processes=2, mixed_precision="bf16"
    ):
        assert inner == "torch.bfloat16" and outer == "torch.float32" and inside == "torch.bfloat16"


def clipping() -> tuple[float, float]:
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 1, bias=False))
    accelerator.backward((model(torch.full((1, 2), 100.0))).sum())
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
    clipped = torch.linalg.vector_norm(model.module.weight.grad).item()
    return float(norm), clipped


def test_clip_grad_norm_clips_and_returns_the_norm() -> None:
    for norm, clipped in notebook_launcher(clipping, num_processes=2):
        assert norm == pytest.approx(100.0 * 2**0.5, rel=1e-5)
        assert clipped == pytest.approx(1.0, rel=1e-4)


def test_fp16_on_cpu_outside_a_launch_has_a_cpu_grad_scaler() -> None:
    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    assert accelerator.mixed_precision == "fp16"
    assert isinstance(accelerator.scaler, torch.amp.GradScaler)
    assert accelerator.scaler._device == "cpu"
    with accelerator.autocast():
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float16


def test_both_spellings_at_once_are_refused() -> None:
    with pytest.raises(ValueError, match="either as dataloader_config"):
        Accelerator(split_batches=True, dataloader_config=DataLoaderConfiguration())
    with pytest.raises(ValueError, match="either as gradient_accumulation_steps"):
        Accelerator(
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(2),
        )


def test_single_process_outside_a_launch() -> None:
    accelerator = Accelerator(cpu=True)
    assert (accelerator.num_processes, accelerator.process_index) == (1, 0)
    assert accelerator.distributed_type.value == "NO"
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert isinstance(model, torch.nn.Linear)
    assert accelerator.gather(torch.ones(2)).tolist() == [1.0, 1.0]
    assert os.environ.get("RANK") is None
    assert not dist.is_initialized()


def value_clipping_and_evaluation_mode() -> tuple[float, str, str]:
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 1, bias=False))
    accelerator.backward(model(torch.full((1, 2), 100.0)).sum())
    accelerator.clip_grad_value_(model.parameters(), clip_value=0.5)
    largest = model.module.weight.grad.abs().max().item()
    evaluated = accelerator.prepare_model(torch.nn.Linear(2, 1), evaluation_mode=True)
    return largest, type(model).__name__, type(evaluated).__name__


def test_clip_grad_value_and_evaluation_mode() -> None:
    for largest, trained, evaluated in notebook_launcher(
        value_clipping_and_evaluation_mode, num_processes=2
    ):
        assert largest == pytest.approx(0.5)
        assert trained == "DistributedDataParallel" and evaluated == "Linear"


def misspelled_keyword() -> None:
    Accelerator(mixed_precison="bf16")


def test_a_misspelled_keyword_in_the_workers_is_one_type_error_in_the_kernel() -> None:
    with pytest.raises(TypeError, match="did you mean 'mixed_precision'") as info:
        notebook_launcher(misspelled_keyword, num_processes=2)
    notes = "\n".join(info.value.__notes__)
    assert "ranks 0, 1 of 2 (identical on each)" in notes


def prepared_with_parallelism(sizes: dict[str, int]) -> dict[str, object]:
    from nb_accel import ParallelismConfig

    config = ParallelismConfig(**sizes)
    accelerator = Accelerator(parallelism_config=config)
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    return {
        "distributed_type": accelerator.distributed_type.value,
        "wrapper": type(model).__name__,
        "sizes": (config.dp_replicate_size, config.dp_shard_size),
        "ranks": (accelerator.data_parallel_rank, accelerator.data_parallel_shard_rank),
    }


@pytest.mark.parametrize(
    ("sizes", "kind", "expected_sizes"),
    [
        ({"dp_shard_size": 2}, "FSDP", (1, 2)),
        ({"dp_replicate_size": 2}, "MULTI_CPU", (2, 1)),
        ({}, "MULTI_CPU", (2, 1)),  # left at 1: the data parallelism that runs spans both
    ],
)
def test_a_parallelism_config_chooses_ddp_or_fsdp2_over_every_process(
    sizes: dict[str, int], kind: str, expected_sizes: tuple[int, int]
) -> None:
    results = notebook_launcher(prepared_with_parallelism, args=(sizes,), num_processes=2)
    for rank, seen in enumerate(results):
        assert seen["distributed_type"] == kind
        assert seen["sizes"] == expected_sizes
        sharded = kind == "FSDP"
        assert (seen["wrapper"] == "DistributedDataParallel") is not sharded
        assert seen["ranks"] == ((0, rank) if sharded else (rank, 0))
