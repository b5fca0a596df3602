"""What a training checkpoint holds and how each file is written and read back.

One folder per checkpoint, with the file names Accelerate uses:

- ``model.safetensors``, ``model_1.safetensors``, ... (``pytorch_model.bin``, ... without
  safetensors): each prepared model's weights, unwrapped;
- ``optimizer.bin``, ``scheduler.bin`` (``_1``, ``_2``, ... for the next ones), ``scaler.pt``;
- ``custom_checkpoint_<i>.pkl``: the ``state_dict()`` of each object registered for
  checkpointing;
- ``random_states_<rank>.pkl``, one per process: its random generators, the position of each
  prepared data loader, and the gradient-accumulation step;
- ``nb_accel_checkpoint.json``: what the folder holds, checked before anything is loaded;
  written last, once every process has written its part, so a folder without it is not a
  complete checkpoint.

Everything but the models is read with ``torch.load(..., weights_only=True)``: tensors and plain
data, never arbitrary objects, unless the caller passes ``load_kwargs={"weights_only": False}``.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data.loader_resume import loader_state, restore_loader_state
from ..data.rng import capture_rng_states, restore_rng_states
from .durable import fsync_path
from .model_io import load_state_dict_file, save_model_files

__all__ = [
    "META_NAME",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "SCHEDULER_NAME",
    "SCALER_NAME",
    "RNG_STATE_NAME",
    "CheckpointContents",
    "load_process_file",
    "load_shared_files",
    "read_meta",
    "model_file_name",
    "numbered_name",
    "safe_load",
    "write_description",
    "write_process_file",
    "write_shared_files",
]

#: The file that marks (and describes) a checkpoint folder.
META_NAME = "nb_accel_checkpoint.json"
# The files' names, as Accelerate's ``save_state`` writes them (``accelerate.utils``'s
# constants).
MODEL_NAME = "pytorch_model"
"""A checkpoint's model file: ``pytorch_model.bin`` (``model.safetensors`` with safetensors),
``pytorch_model_1.bin``... for the next models."""
OPTIMIZER_NAME = "optimizer"
"""A checkpoint's optimizer file: ``optimizer.bin`` (``optimizer_1.bin``... for the next)."""
SCHEDULER_NAME = "scheduler"
"""A checkpoint's scheduler file: ``scheduler.bin`` (``scheduler_1.bin``... for the next)."""
SCALER_NAME = "scaler.pt"
"""A checkpoint's gradient scaler file (fp16 training)."""
RNG_STATE_NAME = "random_states"
"""A checkpoint's random number generators' states: ``random_states_<rank>.pkl``."""
_FORMAT = 1
_NO_SHARDING = 2**62


def numbered_name(stem: str, index: int, suffix: str) -> str:
    """A checkpoint file's name: ``optimizer.bin`` for the first, ``optimizer_1.bin``..."""
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def model_file_name(index: int, safe: bool) -> str:
    """The weights file of prepared model ``index``: ``model.safetensors``, ``model_1...``."""
    return (
        numbered_name("model", index, ".safetensors")
        if safe
        else numbered_name(MODEL_NAME, index, ".bin")
    )


@dataclass
class CheckpointContents:
    """The objects an Accelerator checkpoints, in the order they were prepared or registered."""

    models: list[torch.nn.Module] = field(default_factory=list)  # unwrapped
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    scaler: Any | None = None
    step: int = 0  # gradient-accumulation step
    accumulating: bool = False  # gradients of an unfinished accumulation are held
    sharded: str | None = None  # FSDP's state dict type: models and optimizers written apart

    def counts(self) -> dict[str, int]:
        """How many of each kind (recorded in, and checked against, the checkpoint)."""
        return {
            "models": len(self.models),
            "optimizers": len(self.optimizers),
            "schedulers": len(self.schedulers),
            "dataloaders": len(self.dataloaders),
            "custom_objects": len(self.custom),
            "scaler": int(self.scaler is not None),
        }


def _save(obj: Any, path: Path) -> None:
    torch.save(obj, path)


def write_shared_files(
    folder: Path, contents: CheckpointContents, num_processes: int, safe_serialization: bool
) -> None:
    """The main process's part: models, optimizers, schedulers, scaler and registered objects
    (the description file comes last: :func:`write_description`)."""
    for index, model in enumerate([] if contents.sharded else contents.models):
        save_model_files(
            model.state_dict(),
            folder,
            max_shard_size=_NO_SHARDING,
            safe_serialization=safe_serialization,
            weights_name=model_file_name(index, safe_serialization),
        )
    for index, optimizer in enumerate([] if contents.sharded else contents.optimizers):
        _save(optimizer.state_dict(), folder / numbered_name(OPTIMIZER_NAME, index, ".bin"))
    for index, scheduler in enumerate(contents.schedulers):
        _save(scheduler.state_dict(), folder / numbered_name(SCHEDULER_NAME, index, ".bin"))
    if contents.scaler is not None:
        _save(contents.scaler.state_dict(), folder / SCALER_NAME)
    for index, obj in enumerate(contents.custom):
        _save(obj.state_dict(), folder / f"custom_checkpoint_{index}.pkl")


def write_description(
    folder: Path, contents: CheckpointContents, num_processes: int, safe_serialization: bool
) -> None:
    """The main process's last file, once every process has written its part and flushed it:
    what the folder holds (:data:`META_NAME`), flushed to disk. A folder without it is not a
    checkpoint (its save never completed), and a load refuses it."""
    meta = {
        "format": _FORMAT,
        "num_processes": num_processes,
        "safe_serialization": safe_serialization,
        "fsdp": contents.sharded,
        **contents.counts(),
    }
    path = folder / META_NAME
    path.write_text(json.dumps(meta, indent=2) + "\n")
    fsync_path(path)


def write_process_file(folder: Path, contents: CheckpointContents, process_index: int) -> None:
    """Every process's part: its random generators, its loaders' positions, the step."""
    grads: list[dict[str, torch.Tensor]] = []
    if contents.accumulating:  # this process's own, not yet synchronised, gradients
        grads = [
            {name: p.grad.detach().cpu() for name, p in m.named_parameters() if p.grad is not None}
            for m in contents.models
        ]
    state = {
        "process_index": process_index,
        "rng": capture_rng_states(),
        "dataloaders": [loader_state(loader) for loader in contents.dataloaders],
        "step": contents.step,
        "grads": grads,
    }
    _save(state, folder / f"{RNG_STATE_NAME}_{process_index}.pkl")


def safe_load(path: Path, load_kwargs: dict[str, Any] | None = None) -> Any:
    """``torch.load`` restricted to tensors and plain data (unless ``load_kwargs`` says
    ``weights_only=False``); errors name the file and what to do."""
    if not path.is_file():
        raise FileNotFoundError(f"the checkpoint file {path} is missing")
    options: dict[str, Any] = {"map_location": "cpu", "weights_only": True, **(load_kwargs or {})}
    try:
        return torch.load(path, **options)
    except pickle.UnpicklingError as error:
        if options.get("weights_only"):
            raise ValueError(
                f"{path} holds objects other than tensors and plain data, which are not loaded "
                "without your say-so because unpickling them can run code. If you trust this "
                "checkpoint, pass load_kwargs={'weights_only': False} to load_state. "
                f"({str(error).splitlines()[0]})"
            ) from error
        raise ValueError(f"cannot read {path}: {error}; the file is damaged") from error
    except (RuntimeError, EOFError, OSError) as error:
        raise ValueError(
            f"cannot read {path}: {error}; the file is damaged or incomplete"
        ) from error


def read_meta(folder: Path, contents: CheckpointContents, num_processes: int) -> dict[str, Any]:
    """The checkpoint's description, checked against this run: same number of processes, and
    the same number of models, optimizers, schedulers, loaders and registered objects."""
    path = folder / META_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} is not a complete checkpoint: {META_NAME}, which save_state writes "
            "last, is missing, so the save that wrote it never completed (or another tool "
            "wrote the folder). Load an earlier checkpoint, or save this one again"
        )
    try:
        meta: dict[str, Any] = json.loads(path.read_text())
    except (ValueError, OSError) as error:
        raise ValueError(f"cannot read {path}: {error}; the file is damaged") from error
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
    if meta.get("num_processes") != num_processes:
        raise ValueError(
            f"{folder} was saved by {meta.get('num_processes')} processes and this launch has "
            f"{num_processes}: random states and data positions are kept per process, so load "
            f"it in a launch with num_processes={meta.get('num_processes')}"
        )
    if meta.get("fsdp") != contents.sharded:
        saved, now = (
            f"with FSDP ({v})" if v else "without FSDP"
            for v in (meta.get("fsdp"), contents.sharded)
        )
        raise ValueError(
            f"{folder} was saved {saved} and this Accelerator runs {now}: load it with the "
            "same sharding and state_dict_type as the run that saved it"
        )
    for kind, count in contents.counts().items():
        if meta.get(kind) != count:
            what = "registered for checkpointing" if kind == "custom_objects" else "prepared"
            raise ValueError(
                f"{path} records {meta.get(kind)} {kind.replace('_', ' ')}, this Accelerator "
                f"has {count} {what}: prepare and register the same objects, in the same order, "
                "as the run that saved it"
            )
    return meta


def _load_model(model: torch.nn.Module, path: Path) -> None:
    state = load_state_dict_file(path)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"the weights in {path} do not fit model: {error}") from error


def load_shared_files(
    folder: Path,
    contents: CheckpointContents,
    meta: dict[str, Any],
    load_kwargs: dict[str, Any] | None = None,
) -> None:
    """Load what :func:`write_shared_files` wrote into the live objects."""
    safe = bool(meta.get("safe_serialization", True))
    for index, model in enumerate([] if contents.sharded else contents.models):
        _load_model(model, folder / model_file_name(index, safe))
    for index, optimizer in enumerate([] if contents.sharded else contents.optimizers):
        path = folder / numbered_name(OPTIMIZER_NAME, index, ".bin")
        _load_into(optimizer, path, safe_load(path, load_kwargs))
    for index, scheduler in enumerate(contents.schedulers):
        path = folder / numbered_name(SCHEDULER_NAME, index, ".bin")
        _load_into(scheduler, path, safe_load(path, load_kwargs))
    if contents.scaler is not None:
        path = folder / SCALER_NAME
        _load_into(contents.scaler, path, safe_load(path, load_kwargs))
    for index, obj in enumerate(contents.custom):
        path = folder / f"custom_checkpoint_{index}.pkl"
        _load_into(obj, path, safe_load(path, load_kwargs))


def _load_into(obj: Any, path: Path, state: Any) -> None:
    try:
        obj.load_state_dict(state)
    except (KeyError, ValueError, RuntimeError, TypeError) as error:
        raise ValueError(
            f"{path} does not fit {type(obj).__name__}: {error} (was it saved for a different "
            "object?)"
        ) from error


def load_process_file(
    folder: Path,
    contents: CheckpointContents,
    process_index: int,
    load_kwargs: dict[str, Any] | None = None,
) -> int:
    """Restore this process's random generators and loader positions; returns the saved
    gradient-accumulation step."""
    path = folder / f"{RNG_STATE_NAME}_{process_index}.pkl"
    state = safe_load(path, load_kwargs)
    if not isinstance(state, dict) or state.get("process_index") != process_index:
        raise ValueError(f"{path} is not process {process_index}'s state file")
    for model, grads in zip(contents.models, state.get("grads") or [], strict=False):
        for name, param in model.named_parameters():
            saved_grad = grads.get(name)
            param.grad = None if saved_grad is None else saved_grad.to(param.device, param.dtype)
    for loader, saved in zip(contents.dataloaders, state["dataloaders"], strict=True):
        try:
            restore_loader_state(loader, saved)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from error
    restore_rng_states(state["rng"])
    return int(state.get("step", 0))
