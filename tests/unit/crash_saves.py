"""Saves whose every file says which version it holds, for the crash tests: written in this
process, or in a process of their own (``python crash_saves.py <kind> <folder> <version>
[aside]``) that ``NB_ACCEL_TEST_CRASH_AT`` kills at one step of the commit sequence; and the
loads that read every file back and say which versions they found."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

#: Small enough that the weights of :func:`model_state` take three shards.
SHARD_BYTES = 200


class Version:
    """A registered object: the version of the training state it belongs to."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def model_state(version: int) -> dict[str, torch.Tensor]:
    """Weights of three tensors of 144 bytes, each filled with ``version``."""
    return {f"layer{i}.weight": torch.full((6, 6), float(version)) for i in range(3)}


def save_model(folder: Path, version: int) -> None:
    """``save_model``'s files of :func:`model_state`, in three shards and an index."""
    from nb_accel.runtime.checkpoint.model_files import save_model_files

    save_model_files(model_state(version), folder, max_shard_size=SHARD_BYTES)


def model_versions(folder: Path) -> set[float]:
    """The versions the weights ``load_checkpoint_in_model`` reads from ``folder`` hold."""
    from nb_accel import load_checkpoint_in_model

    model = torch.nn.Module()
    for i in range(3):
        layer = torch.nn.Linear(6, 6, bias=False)
        model.add_module(f"layer{i}", layer)
    load_checkpoint_in_model(model, folder, strict=True)
    return {float(value) for p in model.parameters() for value in p.detach().unique()}


def _accelerator(project: Path, automatic: bool, limit: int | None) -> tuple[object, ...]:
    from nb_accel import Accelerator, ProjectConfiguration

    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=automatic, total_limit=limit
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    version = Version()
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(version)
    return accelerator, model, optimizer, version


def save_state(folder: Path, version: int, automatic: bool = False) -> None:
    """``save_state`` of a model, an optimizer and a registered object, each holding
    ``version``: into ``folder``, or into ``folder/checkpoints/checkpoint_<n>`` with
    ``automatic`` naming, one checkpoint kept."""
    accelerator, model, optimizer, registered = _accelerator(folder, automatic, 1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(version)
    for group in optimizer.param_groups:
        group["lr"] = float(version)
    registered.value = version
    accelerator.save_state(None if automatic else str(folder))


def state_versions(folder: Path, automatic: bool = False) -> set[float]:
    """The versions ``load_state`` finds in the checkpoint of ``folder`` (or in the newest of
    ``folder/checkpoints``): those of the weights, the optimizer and the registered object."""
    accelerator, model, optimizer, registered = _accelerator(folder, automatic, None)
    accelerator.load_state(None if automatic else str(folder))
    found = {float(value) for p in model.parameters() for value in p.detach().unique()}
    found |= {float(group["lr"]) for group in optimizer.param_groups}
    return found | {float(registered.value)}


def main(kind: str, folder: str, version: str, *options: str) -> None:
    """Save version ``version`` of ``kind`` (``model``, ``state``, ``automatic``) into
    ``folder``; with ``aside``, as on a file system that cannot swap two folders."""
    if "aside" in options:
        from nb_accel.runtime.checkpoint import folders

        folders._exchange = lambda first, second: False  # type: ignore[attr-defined]
    if kind == "model":
        save_model(Path(folder), int(version))
    else:
        save_state(Path(folder), int(version), automatic=kind == "automatic")


if __name__ == "__main__":
    main(*sys.argv[1:])
