"""Write a model's weights as files other tools read: one file, or shards plus an index.

File names follow the Hugging Face conventions: ``model.safetensors`` (``pytorch_model.bin``
without safetensors), shards ``model-00001-of-00003.safetensors`` and the index
``model.safetensors.index.json``; which tensor goes to which shard is huggingface_hub's
``split_torch_state_dict_into_shards`` (Accelerate's ``save_model`` uses it too), imported when a
save asks for it. The writing stays here, because the library's ``save_torch_state_dict`` removes
the previous save's files first and then writes in place, so a crash would leave neither: the
files of one save replace the previous save's as one (:mod:`.file_batch`), and files of the same
base name left by an earlier save are removed with them.
:func:`find_checkpoint_file` picks the file to read in a folder; loading lives in
:mod:`nb_accel.runtime.checkpoint.model_io`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from .file_batch import FileBatch, finish_placement

if TYPE_CHECKING:
    from huggingface_hub import StateDictSplit

__all__ = [
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "WEIGHTS_INDEX_NAME",
    "ALIASES_KEY",
    "parse_size",
    "index_name",
    "save_model_files",
    "safetensors_contents",
    "find_checkpoint_file",
    "name_list",
]

SAFE_WEIGHTS_NAME = "model.safetensors"
"""Base name of a safetensors checkpoint."""
WEIGHTS_NAME = "pytorch_model.bin"
"""Base name of a pickle (``torch.save``) checkpoint."""
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
"""The index of a sharded safetensors checkpoint."""
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
"""The index of a sharded pickle checkpoint."""
#: Safetensors header key holding ``{dropped_name: kept_name}`` (JSON) for tied tensors.
ALIASES_KEY = "nb_accel.aliases"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(size: int | str) -> int:
    """Return ``size`` in bytes.

    Accepts a positive int, or a string of a number and an optional unit, case-insensitive and
    with optional spaces: ``"1024"``, ``"200KB"``, ``"500 MB"``, ``"1.5GB"`` (decimal units KB, MB,
    GB, TB are powers of 1000) or ``"5GiB"`` (binary units KiB, MiB, GiB, TiB are powers of 1024).

    Raises:
        ValueError: ``size`` is not such a value, or is not above zero.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        count = size
    elif isinstance(size, str) and (match := _SIZE.fullmatch(size)):
        number, unit = match.groups()
        if unit.lower() not in _UNITS:
            raise ValueError(
                f"unknown size unit {unit!r} in {size!r}: use B, KB, MB, GB, TB, KiB, MiB, GiB "
                "or TiB (for example '10GB' or '500MiB')"
            )
        count = int(Fraction(number) * _UNITS[unit.lower()])
    else:
        raise ValueError(
            f"cannot read {size!r} as a size: give a number of bytes or a string such as "
            "'10GB', '500MB' or '5GiB'"
        )
    if count <= 0:
        raise ValueError(f"size {size!r} must be more than 0 bytes")
    return count


def _split_name(weights_name: str) -> tuple[str, str]:
    stem, ext = os.path.splitext(weights_name)
    return stem, ext


def index_name(weights_name: str) -> str:
    """Name of the index of a sharded save: ``model.safetensors.index.json``."""
    return f"{weights_name}.index.json"


def name_list(names: list[str], shown: int = 10) -> str:
    """``names`` quoted and comma-separated, the first ``shown`` of them then "and N more"."""
    text = ", ".join(repr(name) for name in names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def find_checkpoint_file(checkpoint: str | os.PathLike[str]) -> Path:
    """The weights file or index json to read for ``checkpoint``, a file or a folder.

    A save into the folder that a crash interrupted after its commit is finished first (see
    :mod:`.file_batch`), so the files read are the new ones. A file is returned as it is. In a
    folder, the first found of these: an index of the standard
    names (``model.safetensors.index.json``, then ``pytorch_model.bin.index.json``),
    ``model.safetensors``, ``pytorch_model.bin``, then the only ``*.index.json``, the only
    ``*.safetensors`` or the only ``*.bin`` file.

    Raises:
        FileNotFoundError: ``checkpoint`` does not exist, or the folder holds no weights.
        ValueError: the folder holds several candidates of one kind and none of the standard names.
    """
    path = Path(checkpoint).expanduser()
    finish_placement(path if path.is_dir() else path.parent)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {path} does not exist: give a weights file, an index json or a folder "
            "holding them"
        )
    if not path.is_dir():
        return path
    names = sorted(p.name for p in path.iterdir() if p.is_file())
    for preferred in (index_name(SAFE_WEIGHTS_NAME), index_name(WEIGHTS_NAME)):
        if preferred in names:
            return path / preferred
    for single in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
        if single in names:
            return path / single
    for ending in (".index.json", ".safetensors", ".bin"):
        found = [name for name in names if name.endswith(ending)]
        if len(found) == 1:
            return path / found[0]
        if found:
            raise ValueError(
                f"{path} holds several *{ending} files ({name_list(found)}) and no "
                f"{SAFE_WEIGHTS_NAME} or its index: pass the one to load as the checkpoint"
            )
    raise FileNotFoundError(
        f"no weights found in {path}: expected {index_name(SAFE_WEIGHTS_NAME)}, "
        f"{SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME} or a single *.safetensors / *.bin file; it holds "
        f"{name_list(names) if names else 'no files'}"
    )


def _shard_pattern(weights_name: str) -> re.Pattern[str]:
    stem, ext = _split_name(weights_name)
    return re.compile(rf"{re.escape(stem)}-\d{{5,}}-of-\d{{5,}}{re.escape(ext)}")


@dataclass
class _Entry:
    """One tensor to store, under ``names[0]``; later names are the very same view (tied)."""

    names: list[str]
    tensor: torch.Tensor
    must_own: bool  # shares memory with another entry, or covers only part of its storage
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.tensor.numel() * self.tensor.element_size()

    def to_cpu(self) -> torch.Tensor:
        """The tensor detached, contiguous, on the CPU and owning its memory when it must."""
        source = self.tensor.detach()
        out = source.to("cpu").contiguous()
        if self.must_own and out.untyped_storage().data_ptr() == _storage_ptr(source):
            out = out.clone()
        return out


def _storage_ptr(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _entries(state_dict: Mapping[str, torch.Tensor]) -> list[_Entry]:
    """Group the state dict's names by view: the same memory, offset, shape, stride and dtype."""
    entries: list[_Entry] = []
    by_view: dict[tuple[object, ...], _Entry] = {}
    storages: set[tuple[torch.device, int]] = set()
    for name, tensor in state_dict.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state_dict entry {name!r} is not a str name with a tensor value")
        if tensor.device.type == "meta":
            raise ValueError(
                f"{name!r} is on the meta device and has no data to save: load or "
                "materialize the model's weights before saving"
            )
        if tensor.numel() == 0:
            entries.append(_Entry([name], tensor, must_own=False))
            continue
        ptr = _storage_ptr(tensor)
        shape, stride = tuple(tensor.shape), tensor.stride()
        view = (tensor.device, ptr, tensor.storage_offset(), shape, stride, tensor.dtype)
        if view in by_view:
            by_view[view].names.append(name)
            continue
        whole = tensor.storage_offset() == 0 and (
            tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
        )
        entry = _Entry([name], tensor, must_own=not whole or (tensor.device, ptr) in storages)
        storages.add((tensor.device, ptr))
        by_view[view] = entry
        entries.append(entry)
    return entries


def _split(entries: list[_Entry], weights_name: str, limit: int) -> StateDictSplit:
    """Which stored name goes to which file, as huggingface_hub (and with it Accelerate's
    ``save_model``) decides: shards filled in order up to ``limit``, a tensor above it alone in a
    shard, files named ``model-00001-of-00003.safetensors``. It is asked with data-less stand-ins
    of the tensors as they will be stored, so nothing is copied for the plan."""
    from huggingface_hub import split_torch_state_dict_into_shards

    stem, ext = (part.replace("{", "{{").replace("}", "}}") for part in _split_name(weights_name))
    pattern = f"{stem}{{suffix}}{ext}"
    stand_ins = {
        entry.names[0]: torch.empty(entry.tensor.shape, dtype=entry.tensor.dtype, device="meta")
        for entry in entries
    }
    return split_torch_state_dict_into_shards(
        stand_ins, filename_pattern=pattern, max_shard_size=limit
    )


def _safetensors_file(
    entries: list[_Entry], aliases: Mapping[str, str]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of ``entries`` as one safetensors file stores them, and its header metadata
    (with the aliases whose kept name it holds)."""
    tensors = {entry.names[0]: entry.to_cpu() for entry in entries}
    metadata = {"format": "pt"}
    own = {dropped: kept for dropped, kept in aliases.items() if kept in tensors}
    if own:
        metadata[ALIASES_KEY] = json.dumps(own, sort_keys=True)
    return tensors, metadata


def safetensors_contents(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, str]]:
    """What a safetensors file of ``state_dict`` holds, as :func:`save_model_files` writes it:
    the tensors (on the CPU, contiguous; names tied to the very same view of one memory stored
    once, under the first name; other views of a shared memory as copies of their own), the
    header metadata, and the tied names left out, ``{dropped_name: kept_name}``."""
    entries = _entries(state_dict)
    aliases = {name: entry.names[0] for entry in entries for name in entry.names[1:]}
    tensors, metadata = _safetensors_file(entries, aliases)
    return tensors, metadata, aliases


def _write_shard(
    batch: FileBatch, file: str, shard: list[_Entry], safe: bool, aliases: dict[str, str]
) -> None:
    if safe:
        tensors, metadata = _safetensors_file(shard, aliases)
        batch.write(file, lambda name: save_file(tensors, name, metadata=metadata))
    else:
        # torch.save keeps tied names sharing one storage, so every name is stored.
        tied = {
            name: tensor for entry in shard for tensor in [entry.to_cpu()] for name in entry.names
        }
        batch.write(file, lambda name: torch.save(tied, name))


def _stale(directory: Path, weights_name: str, keep: set[str]) -> list[str]:
    """Files of this base name (the single file, the index, shards) that a save writing
    ``keep`` leaves behind, the index first so that it never lists shards already gone."""
    pattern = _shard_pattern(weights_name)
    names = [index_name(weights_name), weights_name]
    names += sorted(p.name for p in directory.iterdir() if pattern.fullmatch(p.name))
    return [name for name in names if name not in keep and (directory / name).is_file()]


def save_model_files(
    state_dict: Mapping[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
    weights_name: str | None = None,
) -> list[str]:
    """Write ``state_dict`` into ``save_directory`` (created if missing); return the paths written.

    With ``safe_serialization`` the weights go to ``model.safetensors``, else to
    ``pytorch_model.bin`` (``torch.save``); ``weights_name`` replaces that base name. When the
    tensors' bytes pass ``max_shard_size`` (see :func:`parse_size`) they are split into shards
    ``model-00001-of-00003.safetensors`` ... plus ``model.safetensors.index.json``:
    ``{"metadata": {"total_size": bytes}, "weight_map": {name: shard file}}``. The split is
    huggingface_hub's ``split_torch_state_dict_into_shards``, as in Accelerate's ``save_model``:
    shards filled in the state dict's order until the next tensor would pass the limit, and a
    tensor larger than the limit in a shard of its own, listed before the shard being filled.

    Tensors are detached, made contiguous and copied to the CPU. Names holding the very same view
    of one memory (tied weights) are stored once, under the first name: in a safetensors file the
    others are recorded in the header metadata under ``"nb_accel.aliases"`` as a JSON object
    ``{dropped_name: kept_name}``, and in an index under ``"metadata"`` → ``"aliases"``;
    ``torch.save`` files keep every name with the memory shared. Different views of one memory
    (overlapping slices) are stored as independent copies.

    The files replace the previous save's as one (see :mod:`.file_batch`): written into a
    hidden folder beside them and flushed to disk, committed by one rename, then put in place,
    the index last, and files of the same base name left by an earlier save (shards of another
    count, the single file or the index) removed; no other file is. A save that fails or
    crashes before the commit leaves the previous save's files as they were; one that crashes
    after it is finished by the next reader (:func:`find_checkpoint_file`) or save.

    Raises:
        ValueError: ``max_shard_size`` or ``weights_name`` is invalid, or a tensor is on the
            meta device.
        TypeError: a state-dict entry is not a tensor with a str name.
    """
    limit = parse_size(max_shard_size)
    base = weights_name or (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    if base in ("", ".", "..") or os.path.basename(base) != base:
        raise ValueError(f"weights_name {base!r} must be a plain file name, without folders")
    directory = Path(save_directory).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    entries = _entries(state_dict)
    aliases = {name: entry.names[0] for entry in entries for name in entry.names[1:]}
    split = _split(entries, base, limit)
    by_name = {entry.names[0]: entry for entry in entries}
    files = split.filename_to_tensors if split.is_sharded else {base: list(by_name)}
    with FileBatch(directory) as batch:
        for name, stored in files.items():
            shard = [by_name[n] for n in stored]
            _write_shard(batch, name, shard, safe_serialization, aliases)
        if split.is_sharded:
            text = _index_text(split, aliases, safe_serialization)
            index = index_name(base)
            batch.write(index, lambda n: Path(n).write_text(text, encoding="utf-8"))
            files = {**files, index: []}
        batch.remove(_stale(directory, base, keep=set(files)))
    return [str(directory / name) for name in files]


def _index_text(split: StateDictSplit, aliases: dict[str, str], safe: bool) -> str:
    """The index of a sharded save, as Accelerate writes it (keys sorted, indented by two), with
    the tied names: recorded under ``"aliases"`` for safetensors, which stores them once, and in
    the weight map beside the name they share memory with for ``torch.save`` files."""
    weight_map = dict(split.tensor_to_filename)
    metadata: dict[str, object] = dict(split.metadata)
    if safe and aliases:
        metadata["aliases"] = aliases
    elif not safe:
        weight_map.update({dropped: weight_map[kept] for dropped, kept in aliases.items()})
    text = json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2, sort_keys=True)
    return text + "\n"
