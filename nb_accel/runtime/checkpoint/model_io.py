"""Model weights on disk: save them as Hugging Face-style files and load them back into a model.

Saving (:func:`save_model_files`, :func:`parse_size`) lives in
:mod:`nb_accel.runtime.checkpoint.model_files` and is re-exported here. Loading never unpickles
arbitrary objects: safetensors files are read with ``safetensors`` and ``.bin``/``.pt`` files with
``torch.load(..., weights_only=True)``. Sharded checkpoints are read one shard at a time.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .model_files import (
    ALIASES_KEY,
    find_checkpoint_file,
    name_list,
    parse_size,
    save_model_files,
)

__all__ = [
    "parse_size",
    "save_model_files",
    "load_state_dict_file",
    "load_checkpoint_in_model",
]

_DTYPE_ALIASES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def _corrupt(path: Path, exc: BaseException) -> ValueError:
    return ValueError(
        f"cannot read {path}: {exc}. The file is corrupt, truncated or not a weights file of "
        "this kind: save it again or restore a good copy"
    )


def _aliases(raw: object, path: Path) -> dict[str, str]:
    """Validate ``{dropped_name: kept_name}`` read from ``path``."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise _corrupt(path, exc) from exc
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise _corrupt(path, ValueError("its aliases are not a mapping of names to names"))
    return dict(raw)


def _read_header(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Shapes of the tensors in a safetensors file, and its aliases, without reading the data."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise _corrupt(path, exc) from exc
    return shapes, _aliases(metadata.get(ALIASES_KEY), path)


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    """Read a ``torch.save`` file of tensors, refusing any other pickled object."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        detail = str(exc)
        if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in detail:
            reason = next(
                (line.strip() for line in detail.splitlines() if "WeightsUnpickler" in line),
                detail.strip(),
            )
            raise ValueError(
                f"refusing to load {path}: it holds pickled objects other than tensors "
                f"({reason}). Only tensors are read from pickle files, since unpickling other "
                "objects can run arbitrary code: re-save the weights as a state dict of tensors, "
                "preferably with safetensors"
            ) from exc
        raise _corrupt(path, exc) from exc
    if not isinstance(loaded, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise ValueError(
            f"{path} does not hold a state dict (a mapping of parameter names to tensors)"
        )
    return dict(loaded)


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors stored in one weights file, on the CPU, as stored (aliases not restored)."""
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if path.suffix != ".safetensors":
        return _torch_load(path)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise _corrupt(path, exc) from exc


def load_state_dict_file(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Read one weights file into a ``{name: tensor}`` dict on ``device``.

    A ``.safetensors`` file is read with safetensors (no pickle); any other file with
    ``torch.load(..., weights_only=True)``, which refuses pickled objects other than tensors.
    Names dropped as tied aliases by :func:`save_model_files` come back, as the same tensor object
    as the name they were tied to.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ValueError: the file is corrupt or truncated, holds objects other than tensors, or is
            not a state dict; the message names the file.
    """
    file = Path(path).expanduser()
    tensors = _read_file(file)
    if file.suffix == ".safetensors":
        _, aliases = _read_header(file)
        for dropped, kept in aliases.items():
            if kept in tensors:
                tensors.setdefault(dropped, tensors[kept])
    target = torch.device(device)
    if target.type != "cpu":
        moved: dict[int, torch.Tensor] = {}  # keeps tied names tied
        for name, tensor in tensors.items():
            if id(tensor) not in moved:
                moved[id(tensor)] = tensor.to(target)
            tensors[name] = moved[id(tensor)]
    return tensors


@dataclass
class _Checkpoint:
    """What a checkpoint holds, known before its tensors are read."""

    origin: Path  # the file or index named in messages
    where: dict[str, Path]  # stored name -> file holding it
    aliases: dict[str, str] = field(default_factory=dict)  # dropped name -> kept name
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # those known up front
    loaded: dict[str, torch.Tensor] | None = None  # a single .bin file, already read

    def files(self) -> list[Path]:
        """The files to read, in order of first appearance."""
        return list(dict.fromkeys(self.where.values()))


def _open_checkpoint(path: Path) -> _Checkpoint:
    if path.name.endswith(".json"):
        return _open_index(path)
    if path.suffix == ".safetensors":
        shapes, aliases = _read_header(path)
        return _Checkpoint(path, dict.fromkeys(shapes, path), aliases, shapes)
    tensors = _torch_load(path)
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    return _Checkpoint(path, dict.fromkeys(tensors, path), {}, shapes, tensors)


def _open_index(path: Path) -> _Checkpoint:
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _corrupt(path, exc) from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ValueError(
            f"{path} is not a checkpoint index: it has no 'weight_map' of names to files"
        )
    metadata = index.get("metadata")
    aliases = _aliases(metadata.get("aliases") if isinstance(metadata, dict) else None, path)
    checkpoint = _Checkpoint(path, {k: path.parent / v for k, v in weight_map.items()}, aliases)
    absent = [file.name for file in checkpoint.files() if not file.is_file()]
    if absent:
        raise FileNotFoundError(
            f"{path} lists shard files that are missing: {name_list(absent)}. The checkpoint is "
            "incomplete: copy the missing shards next to the index, or save the model again"
        )
    for file in checkpoint.files():
        if file.suffix == ".safetensors":
            shapes, _ = _read_header(file)
            absent = [n for n, f in checkpoint.where.items() if f == file and n not in shapes]
            if absent:
                raise ValueError(
                    f"{path} lists {name_list(absent)} in {file}, which does not hold it"
                )
            checkpoint.shapes.update(shapes)
    return checkpoint


def _parse_device_map(
    device_map: Mapping[str, int | str | torch.device] | None,
) -> dict[str, torch.device]:
    devices: dict[str, torch.device] = {}
    for prefix, device in (device_map or {}).items():
        if isinstance(device, str) and device.strip().lower() == "disk":
            raise ValueError(
                f"device_map sends {prefix!r} to 'disk', but offloading weights to disk is not "
                "supported: map every module to a device such as 'cpu', 'cuda:0' or 0"
            )
        try:
            if isinstance(device, int) and not isinstance(device, bool):
                devices[prefix] = torch.device("cuda", device)
            else:
                devices[prefix] = torch.device(device)  # type: ignore[arg-type]
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ValueError(
                f"device_map[{prefix!r}] = {device!r} is not a device: use 'cpu', 'cuda:0' or a "
                f"CUDA index ({exc})"
            ) from exc
    return devices


def _device_for(name: str, devices: dict[str, torch.device]) -> torch.device | None:
    """The device of the longest prefix of ``name`` in ``devices`` ("" matches every name)."""
    matches = [p for p in devices if p == "" or name == p or name.startswith(p + ".")]
    return devices[max(matches, key=len)] if matches else None


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        found = getattr(torch, _DTYPE_ALIASES.get(name, name), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}: use 'float16', 'bfloat16' or 'float32'")
        dtype = found
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype {dtype} is not a floating-point type; only floats are cast")
    return dtype


def _replace(model: torch.nn.Module, old: torch.Tensor, new: torch.Tensor) -> None:
    """Register ``new`` wherever ``old`` is (for a tensor whose data cannot be swapped)."""
    if isinstance(old, torch.nn.Parameter):
        parameter = torch.nn.Parameter(new, requires_grad=old.requires_grad)
        for module in model.modules():
            for key, value in module._parameters.items():
                if value is old:
                    module._parameters[key] = parameter
    else:
        for module in model.modules():
            for key, buffer in module._buffers.items():
                if buffer is old:
                    module._buffers[key] = new


@dataclass
class _Target:
    """Where and how the tensors go."""

    model: torch.nn.Module
    devices: dict[str, torch.device]
    dtype: torch.dtype | None
    keep_in_fp32: tuple[str, ...] = ()

    def _dtype_for(self, name: str) -> torch.dtype | None:
        """The dtype ``dtype`` asks for ``name``: float32 inside a module kept in fp32."""
        if self.dtype is None:
            return None
        parts = name.split(".")
        kept = any(
            parts[i : i + len(k.split("."))] == k.split(".")
            for k in self.keep_in_fp32
            for i in range(len(parts))
        )
        return torch.float32 if kept else self.dtype

    def assign(self, name: str, value: torch.Tensor, file: Path) -> None:
        """Load ``value`` into the model's parameter or buffer ``name``."""
        module_name, _, attribute = name.rpartition(".")
        current = getattr(self.model.get_submodule(module_name), attribute)
        if tuple(value.shape) != tuple(current.shape):
            raise _mismatch(name, tuple(value.shape), tuple(current.shape), file)
        device = _device_for(name, self.devices)
        if device is None:  # where the model's tensor is; the CPU for one without data
            device = current.device if current.device.type != "meta" else torch.device("cpu")
        wanted = self._dtype_for(name)
        dtype = wanted if wanted is not None and value.is_floating_point() else current.dtype
        with torch.no_grad():
            if current.device == device and current.dtype == dtype:
                current.copy_(value)  # in place: optimizers holding the tensor keep it
                return
            new = value.to(device=device, dtype=dtype, copy=True)
            try:
                current.data = new
            except RuntimeError:  # a meta tensor cannot take real data: register a new one
                _replace(self.model, current, new)


def _mismatch(
    name: str, stored: tuple[int, ...], wanted: tuple[int, ...], file: Path
) -> ValueError:
    return ValueError(
        f"size mismatch for {name!r}: {file} holds shape {stored}, the model has {wanted}. "
        "The checkpoint was saved from a differently configured model"
    )


def load_checkpoint_in_model(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: Mapping[str, int | str | torch.device] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Sequence[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load the weights in ``checkpoint`` into ``model``'s parameters and persistent buffers.

    ``checkpoint`` is a weights file (``.safetensors``, or ``.bin``/``.pt``/``.pth`` read with
    ``weights_only=True``), an index json of a sharded checkpoint, or a folder. In a folder the
    first found of these is read: ``model.safetensors.index.json``,
    ``pytorch_model.bin.index.json``, ``model.safetensors``, ``pytorch_model.bin``, then the only
    ``*.index.json``, the only ``*.safetensors`` or the only ``*.bin`` file. Shards are read one
    at a time.

    ``device_map`` maps module-name prefixes to devices (ints are CUDA indices; ``{"": d}`` puts
    everything on ``d``): each tensor goes to the device of the longest prefix matching its name
    (the name itself, or the name starting with prefix + "."); a tensor matched by no prefix, or
    every tensor without a ``device_map``, goes where the model's tensor already is (the CPU for
    a meta tensor). ``"disk"`` is refused: offloading is not supported. ``dtype`` (a
    ``torch.dtype`` or a name like ``"bfloat16"``) casts floating-point tensors; other tensors,
    and all of them without ``dtype``, take the model tensor's dtype; with
    ``keep_in_fp32_modules`` (module names, such as ``["lm_head"]``) the tensors inside those
    modules are cast to float32 instead.

    The parameters as Accelerate has them, in its order: ``offload_folder``,
    ``offload_buffers`` and ``offload_8bit_bnb`` apply to weights offloaded to a disk (refused
    above) and ``offload_state_dict`` to a memory saving on the way; none changes what is
    loaded. The whole checkpoint is read on every process (``full_state_dict=True``):
    ``full_state_dict=False`` and ``broadcast_from_rank0=True``, for sharded models, are refused
    with ``NotImplementedError`` (load the weights before ``prepare()``, or use
    ``accelerator.load_state``).

    A tensor already on the right device with the right dtype is copied in place, so optimizers
    holding the parameter keep working; otherwise its ``.data`` is replaced. Tied weights: a name
    missing from the checkpoint but recorded as an alias is filled from the name it was tied to,
    and a model name that is the same tensor as a loaded name counts as loaded.

    Names in the model but not the checkpoint (missing) or in the checkpoint but not the model
    (unexpected) raise ``RuntimeError`` before anything is loaded with ``strict=True``, and are
    listed in one warning otherwise.

    Raises:
        FileNotFoundError: the checkpoint, or a shard its index lists, does not exist.
        ValueError: a file is corrupt, holds objects other than tensors, or a tensor's shape
            differs from the model's (the message names the key, both shapes and the file);
            ``device_map`` or ``dtype`` is invalid.
        RuntimeError: ``strict=True`` and the names do not match.
    """
    del offload_folder, offload_state_dict, offload_buffers, offload_8bit_bnb  # see above
    if not full_state_dict or broadcast_from_rank0:
        raise NotImplementedError(
            "load_checkpoint_in_model reads whole weights on every process: "
            "full_state_dict=False and broadcast_from_rank0=True are not supported. Load the "
            "weights before accelerator.prepare(model), or save and load the sharded model "
            "with accelerator.save_state / load_state"
        )
    keep = tuple(keep_in_fp32_modules or ())
    target = _Target(model, _parse_device_map(device_map), _parse_dtype(dtype), keep)
    source = _open_checkpoint(find_checkpoint_file(checkpoint))
    tensors = {  # parameters and persistent buffers, tied names included
        name: value
        for name, value in model.state_dict(keep_vars=True).items()
        if isinstance(value, torch.Tensor)
    }
    aliases = {
        d: k for d, k in source.aliases.items() if k in source.where and d not in source.where
    }
    provided = [*source.where, *aliases]
    filled = {id(tensors[name]) for name in provided if name in tensors}
    missing = [n for n in tensors if n not in source.where and n not in aliases]
    missing = [n for n in missing if id(tensors[n]) not in filled]
    unexpected = [name for name in provided if name not in tensors]
    for name in provided:
        shape = source.shapes.get(aliases.get(name, name))
        if name in tensors and shape is not None and shape != tuple(tensors[name].shape):
            file = source.where[aliases.get(name, name)]
            raise _mismatch(name, shape, tuple(tensors[name].shape), file)
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing (in the model only): {name_list(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected (in the checkpoint only): ")
        problems[-1] += name_list(unexpected)
    if problems:
        text = "; ".join(problems)
        if strict:
            raise RuntimeError(
                f"checkpoint {source.origin} does not match the model: {text}. Nothing was "
                "loaded; pass strict=False to load the matching names anyway"
            )
        warnings.warn(f"checkpoint {source.origin} does not match the model: {text}", stacklevel=2)
    followers: dict[str, list[str]] = {}
    for dropped, kept in aliases.items():
        followers.setdefault(kept, []).append(dropped)
    for file in source.files():
        stored = source.loaded if source.loaded is not None else _read_file(file)
        for name in [n for n, f in source.where.items() if f == file]:
            if name not in stored:
                raise ValueError(
                    f"{source.origin} lists {name!r} in {file}, which does not hold it"
                )
            for each in [name, *followers.get(name, [])]:
                if each in tensors:
                    target.assign(each, stored[name], file)
        del stored
