"""The files of sharded (FSDP) models and their optimizers in a checkpoint, written and read
with the state dicts the sharding strategy gives (``runtime/sharding/``).

With ``SHARDED_STATE_DICT`` every process writes its own shards through
``torch.distributed.checkpoint`` (Accelerate's folder names): ``pytorch_model_fsdp_<i>/`` and
``optimizer_<i>/``, each a DCP folder (``.metadata`` and one ``__<rank>_0.distcp`` per
process). With ``FULL_STATE_DICT`` the main process writes whole weights, as for an unsharded
model (``model.safetensors``, readable by a plain model), and the whole optimizer state keyed by
parameter name (``optimizer.bin``). :func:`merge_fsdp_weights` turns a sharded model folder into
whole weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..fsdp.state_dicts import model_of
from ..sharding import ShardingStrategy
from .contents import (
    OPTIMIZER_NAME,
    CheckpointContents,
    model_file_name,
    numbered_name,
    safe_load,
)
from .model_io import load_state_dict_file, save_model_files

__all__ = ["load_sharded_parts", "merge_fsdp_weights", "save_sharded_parts"]

_MODEL_DIR = "pytorch_model_fsdp"
_OPTIMIZER_DIR = "optimizer"
_NO_SPLIT = 2**62


def _owner(optimizer: Any, models: list[torch.nn.Module], index: int) -> torch.nn.Module:
    model = model_of(getattr(optimizer, "optimizer", optimizer), models)
    if model is None:
        raise ValueError(
            f"optimizer #{index} updates none of the prepared models' parameters: under FSDP "
            "each optimizer is saved with the model it updates"
        )
    return model


def save_sharded_parts(
    strategy: ShardingStrategy, folder: Path, contents: CheckpointContents, safe: bool
) -> None:
    """Collective: write every model's weights and every optimizer's state of ``contents``
    into ``folder``, in the layout ``contents.sharded`` (the strategy's
    :meth:`~ShardingStrategy.checkpoint_layout`)."""
    import torch.distributed.checkpoint as dcp

    models, kind = contents.models, contents.sharded
    main = dist.get_rank() == 0
    for index, model in enumerate(models):
        if kind == "SHARDED_STATE_DICT" and strategy.is_sharded(model):
            target = folder / f"{_MODEL_DIR}_{index}"
            dcp.save({"model": strategy.model_state_dict(model, full=False)}, checkpoint_id=target)
            continue
        state = strategy.model_state_dict(model, full=True)
        if main:
            name = model_file_name(index, safe)
            save_model_files(
                state, folder, max_shard_size=_NO_SPLIT, safe_serialization=safe, weights_name=name
            )
    for index, optimizer in enumerate(contents.optimizers):
        inner = getattr(optimizer, "optimizer", optimizer)
        model = _owner(optimizer, models, index)
        if kind == "SHARDED_STATE_DICT":
            state = strategy.optimizer_state_dict(model, inner, full=False)
            dcp.save({"optimizer": state}, checkpoint_id=folder / f"{_OPTIMIZER_DIR}_{index}")
            continue
        state = strategy.optimizer_state_dict(model, inner, full=True)
        if main:
            torch.save(state, folder / numbered_name(OPTIMIZER_NAME, index, ".bin"))


def load_sharded_parts(
    strategy: ShardingStrategy,
    folder: Path,
    contents: CheckpointContents,
    safe: bool,
    load_kwargs: dict[str, Any] | None = None,
) -> None:
    """Collective: load what :func:`save_sharded_parts` wrote into the live objects of
    ``contents``."""
    import torch.distributed.checkpoint as dcp

    models, kind = contents.models, contents.sharded
    for index, model in enumerate(models):
        if kind == "SHARDED_STATE_DICT" and strategy.is_sharded(model):
            state = {"model": strategy.model_state_dict(model, full=False)}
            dcp.load(state, checkpoint_id=_existing(folder / f"{_MODEL_DIR}_{index}"))
            strategy.load_model_state_dict(model, state["model"], full=False)
            continue
        weights = load_state_dict_file(_existing(folder / model_file_name(index, safe)))
        strategy.load_model_state_dict(model, weights, full=True)
    for index, optimizer in enumerate(contents.optimizers):
        inner = getattr(optimizer, "optimizer", optimizer)
        model = _owner(optimizer, models, index)
        if kind == "SHARDED_STATE_DICT":
            state = {"optimizer": strategy.optimizer_state_dict(model, inner, full=False)}
            dcp.load(state, checkpoint_id=_existing(folder / f"{_OPTIMIZER_DIR}_{index}"))
            strategy.load_optimizer_state_dict(model, inner, state["optimizer"], full=False)
            continue
        saved = safe_load(folder / numbered_name(OPTIMIZER_NAME, index, ".bin"), load_kwargs)
        strategy.load_optimizer_state_dict(model, inner, saved, full=True)


def _existing(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"the checkpoint part {path} is missing")
    return path


def merge_fsdp_weights(
    checkpoint_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path:
    """Whole weights from a sharded model folder (``pytorch_model_fsdp_0`` of a checkpoint), in
    one process, without a process group: written to ``output_path`` as ``model.safetensors``
    (``pytorch_model.bin`` without ``safe_serialization``), loadable by the plain model with
    ``load_state_dict``. Returns the weights file."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    source = Path(checkpoint_dir).expanduser()
    if not (source / ".metadata").is_file():
        raise ValueError(
            f"{source} is not a sharded model folder (no .metadata): pass the "
            f"{_MODEL_DIR}_<i> folder of a checkpoint saved with SHARDED_STATE_DICT"
        )
    output = Path(output_path).expanduser()
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output) as scratch:
        merged = Path(scratch) / "merged.pt"
        dcp_to_torch_save(source, merged)
        state = torch.load(merged, map_location="cpu", weights_only=True)
    if set(state) == {"model"}:
        state = state["model"]
    save_model_files(state, output, max_shard_size=_NO_SPLIT, safe_serialization=safe_serialization)
    if remove_checkpoint_dir:
        shutil.rmtree(source)
    return output / model_file_name(0, safe_serialization)
