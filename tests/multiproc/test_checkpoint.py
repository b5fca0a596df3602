"""save_state / load_state on real worker groups: exact resume, crash safety, pruning, errors."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from nb_accel import (
    Accelerator,
    ProjectConfiguration,
    load_checkpoint_in_model,
    notebook_launcher,
    set_seed,
)
from nb_accel.errors import WorkerDiedError

SAMPLES, BATCH = 32, 4  # 2 processes: 4 steps per epoch
TOTAL, SAVE_AT = 10, 5  # the checkpoint falls in the middle of the second epoch


class Indexed(Dataset):  # type: ignore[type-arg]
    """Fixed inputs, and each sample's index so the batches seen can be compared."""

    def __init__(self) -> None:
        self.x = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.x[index], index


def _snapshot(model: nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    optimizer_state = optimizer.state_dict()["state"]
    return {
        "params": {name: value.clone() for name, value in model.state_dict().items()},
        "optimizer": {
            (key, name): value.clone() if isinstance(value, torch.Tensor) else value
            for key, slots in optimizer_state.items()
            for name, value in slots.items()
        },
        "lr": scheduler.get_last_lr(),
    }


def train(project: str, mode: str, options: dict[str, Any]) -> dict[str, Any]:
    """``full``: 10 steps. ``first``: train to ``save_at``, then save_state (inside the loop,
    or after a ``break`` with ``after_break``). ``resume``: load_state, then the remaining
    steps, skipping the batches the interrupted epoch had already given."""
    set_seed(7)
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True),
        dispatch_batches=options.get("dispatch", False),
        gradient_accumulation_steps=options.get("accumulate", 1),
        use_seedable_sampler=options.get("seedable", False),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = DataLoader(Indexed(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    save_at = options.get("save_at", SAVE_AT)
    step, seen = 0, []
    if mode == "resume":
        accelerator.load_state()
        step = save_at
    per_epoch = len(loader)
    while step < TOTAL:
        skip = step % per_epoch
        active = accelerator.skip_first_batches(loader, skip) if skip else loader
        for x, index in active:
            with accelerator.accumulate(model):
                loss = model(x).pow(2).mean()
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            seen.append(index.tolist())
            step += 1
            if mode == "first" and step == save_at:
                if options.get("after_break"):
                    break
                folder = accelerator.save_state()
                return {"seen": seen, "folder": folder, "next": accelerator.save_iteration}
            if step == TOTAL:
                break
        if mode == "first" and step == save_at:
            folder = accelerator.save_state()
            return {"seen": seen, "folder": folder, "next": accelerator.save_iteration}
    return {"seen": seen, **_snapshot(accelerator.unwrap_model(model), optimizer, scheduler)}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


SCENARIOS = {
    "shard": {},
    "dispatch": {"dispatch": True},
    "last_batch_of_an_epoch": {"save_at": 4},
    "after_a_break": {"after_break": True},
    "mid_accumulation": {"accumulate": 2},
    "seedable_sampler": {"seedable": True},
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_resumed_run_equals_the_uninterrupted_one_exactly(tmp_path: Path, scenario: str) -> None:
    options = SCENARIOS[scenario]

    def launch(project: str, mode: str) -> list[dict[str, Any]]:
        return notebook_launcher(
            train, args=(str(tmp_path / project), mode, options), num_processes=2
        )

    full, first, resumed = launch("full", "full"), launch("run", "first"), launch("run", "resume")
    assert first[0]["folder"].endswith(os.path.join("checkpoints", "checkpoint_0"))
    assert first[0]["next"] == 1
    for rank in range(2):
        assert first[rank]["seen"] + resumed[rank]["seen"] == full[rank]["seen"]
        assert len(full[rank]["seen"]) == TOTAL
        for key in ("params", "optimizer", "lr"):
            assert _equal(resumed[rank][key], full[rank][key]), key
    assert full[0]["seen"] != full[1]["seen"]  # the ranks saw different shards
    if scenario == "shard":
        folder = tmp_path / "run" / "checkpoints" / "checkpoint_0"
        assert sorted(p.name for p in folder.iterdir()) == [
            "model.safetensors",
            "nb_accel_checkpoint.json",
            "optimizer.bin",
            "random_states_0.pkl",
            "random_states_1.pkl",
            "scheduler.bin",
        ]


class Counter:
    """A registered object; the second save of it kills the main process half-way."""

    def __init__(self, explode_on: int | None = None) -> None:
        self.value, self.saves, self.explode_on = 0, 0, explode_on

    def state_dict(self) -> dict[str, int]:
        self.saves += 1
        if self.saves == self.explode_on:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def save_then_die(project: str) -> None:
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    )
    counter = Counter(explode_on=2 if accelerator.is_main_process else None)
    accelerator.register_for_checkpointing(counter)
    counter.value = 1
    accelerator.save_state()
    counter.value = 2
    accelerator.save_state()  # the main process is killed while writing this one


def load_newest(project: str) -> dict[str, Any]:
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    )
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    accelerator.load_state()
    loaded = (counter.value, accelerator.save_iteration)
    accelerator.save_state()
    return {"loaded": loaded, "entries": sorted(os.listdir(Path(project) / "checkpoints"))}


def test_a_worker_killed_during_save_state_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    project = str(tmp_path / "project")
    with pytest.raises(WorkerDiedError, match="SIGKILL"):
        notebook_launcher(save_then_die, args=(project,), num_processes=2)
    entries = sorted(os.listdir(tmp_path / "project" / "checkpoints"))
    assert entries[-1] == "checkpoint_0" and len(entries) == 2  # plus a hidden staging folder
    assert entries[0].startswith(".checkpoint_1.partial-")
    after = notebook_launcher(load_newest, args=(project,), num_processes=2)
    assert after[0]["loaded"] == after[1]["loaded"] == (1, 1)
    assert after[0]["entries"] == ["checkpoint_0", "checkpoint_1"]  # the leftover is gone


def prune_and_misuse(project: str) -> dict[str, Any]:
    config = ProjectConfiguration(
        project_dir=project, automatic_checkpoint_naming=True, total_limit=2
    )
    accelerator = Accelerator(project_config=config)
    model = accelerator.prepare(nn.Linear(2, 2))
    for _ in range(5):
        accelerator.save_state()
    kept = sorted(os.listdir(Path(project) / "checkpoints"))
    accelerator.load_state()
    out: dict[str, Any] = {"kept": kept, "next": accelerator.save_iteration}
    extra = Accelerator(project_config=config)  # shares the state; one model too many
    extra.prepare(nn.Linear(2, 2), nn.Linear(2, 2))
    try:
        extra.load_state()
    except ValueError as error:
        out["count_error"] = str(error)
    del model
    return out


def test_total_limit_keeps_the_newest_and_mismatches_are_named(tmp_path: Path) -> None:
    results = notebook_launcher(prune_and_misuse, args=(str(tmp_path / "p"),), num_processes=2)
    for out in results:
        assert out["kept"] == ["checkpoint_3", "checkpoint_4"]
        assert out["next"] == 5
        assert (
            "checkpoint_4" in out["count_error"]
            and "records 1 models, this Accelerator has 2" in out["count_error"]
        )


def save_numbered(project: str, run: int, saves: int) -> dict[str, Any]:
    """One run in ``project``: ``saves`` checkpoints (total_limit=2), the i-th holding 10*run+i;
    whether each folder save_state returned was there when it returned."""
    config = ProjectConfiguration(
        project_dir=project, automatic_checkpoint_naming=True, total_limit=2
    )
    accelerator = Accelerator(project_config=config)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    written = []
    for i in range(saves):
        counter.value = 10 * run + i
        folder = accelerator.save_state()
        written.append((folder, os.path.isdir(folder)))
    return {"written": written, "kept": sorted(os.listdir(Path(project) / "checkpoints"))}


def test_a_rerun_in_the_same_folder_continues_the_numbering(tmp_path: Path) -> None:
    project = str(tmp_path / "project")
    first = notebook_launcher(save_numbered, args=(project, 1, 3), num_processes=2)
    second = notebook_launcher(save_numbered, args=(project, 2, 2), num_processes=2)
    for run, saved in ((first, [0, 1, 2]), (second, [3, 4])):
        assert run[0] == run[1]  # every process returns the same folders
        expected = [str(Path(project) / "checkpoints" / f"checkpoint_{n}") for n in saved]
        assert run[0]["written"] == [(folder, True) for folder in expected]
    assert first[0]["kept"] == ["checkpoint_1", "checkpoint_2"]
    assert second[0]["kept"] == ["checkpoint_3", "checkpoint_4"]
    for folder, _ in second[0]["written"]:
        assert Path(folder).is_dir(), folder  # the second run's checkpoints are all kept
    after = notebook_launcher(load_newest, args=(project,), num_processes=2)
    assert after[0]["loaded"] == after[1]["loaded"] == (21, 5)  # the last one written
    assert after[0]["entries"] == ["checkpoint_3", "checkpoint_4", "checkpoint_5"]


def save_plain(folder: str) -> None:
    accelerator = Accelerator()
    model = accelerator.prepare(nn.Linear(3, 1))
    accelerator.register_for_checkpointing(Counter())
    accelerator.save_state(folder)
    del model


def load_plain(folder: str, load_kwargs: dict[str, Any] | None) -> None:
    accelerator = Accelerator()
    accelerator.prepare(nn.Linear(3, 1))
    accelerator.register_for_checkpointing(Counter())
    accelerator.load_state(folder, load_kwargs=load_kwargs)


class Opaque:
    """Not plain data: unpickling it needs the class."""


def test_bad_checkpoints_are_clear_errors_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    notebook_launcher(save_plain, args=(str(folder),), num_processes=2)
    with pytest.raises(ValueError, match="saved by 2 processes and this launch has 1"):
        notebook_launcher(load_plain, args=(str(folder), None), num_processes=1)
    notebook_launcher(load_plain, args=(str(folder), None), num_processes=2)  # loads fine
    state = folder / "random_states_1.pkl"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"cannot read .*random_states_1\.pkl"):
        notebook_launcher(load_plain, args=(str(folder), None), num_processes=2)
    (folder / "random_states_1.pkl").unlink()
    with pytest.raises(FileNotFoundError, match=r"random_states_1\.pkl is missing"):
        notebook_launcher(load_plain, args=(str(folder), None), num_processes=2)
    notebook_launcher(save_plain, args=(str(folder),), num_processes=2)  # replaces the folder
    torch.save({"value": Opaque()}, folder / "custom_checkpoint_0.pkl")
    with pytest.raises(ValueError, match=r"custom_checkpoint_0\.pkl holds objects other than"):
        notebook_launcher(load_plain, args=(str(folder), None), num_processes=2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        notebook_launcher(load_plain, args=(str(tmp_path / "nowhere"), None), num_processes=2)
    work = tmp_path / "work"
    work.mkdir()
    (work / "analysis.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="exists and is not a checkpoint folder"):
        notebook_launcher(save_plain, args=(str(work),), num_processes=2)
    assert [p.name for p in work.iterdir()] == ["analysis.ipynb"]  # untouched


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Linear(16, 16)
        self.out = nn.Linear(16, 50, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.body(self.embed(tokens))))


def train_and_save_model(folder: str) -> dict[str, torch.Tensor]:
    set_seed(1)
    accelerator = Accelerator()
    model = Tied()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    tokens = torch.randint(0, 50, (8, 4))
    accelerator.backward(model(tokens).logsumexp(-1).mean())
    optimizer.step()
    accelerator.wait_for_everyone()
    accelerator.save_model(model, folder, max_shard_size="4KB")
    accelerator.wait_for_everyone()
    return {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def test_save_model_shards_and_load_checkpoint_in_model_reads_them(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    trained = notebook_launcher(train_and_save_model, args=(str(folder),), num_processes=2)[0]
    names = sorted(p.name for p in folder.iterdir())
    assert "model.safetensors.index.json" in names
    assert len([n for n in names if n.endswith(".safetensors")]) > 1  # sharded at 4 KB
    fresh = Tied()
    load_checkpoint_in_model(fresh, folder, device_map={"": "cpu"}, strict=True)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, trained[name]), name
    assert fresh.out.weight is fresh.embed.weight  # still tied
