"""The Accelerator's checkpoint methods: save_state, load_state, save_model, save."""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..collectives.ops import broadcast_object_list, gather_object
from ..options import ProjectConfiguration
from ..state import AcceleratorState, GradientState, PartialState
from ..training.accumulation import GradientAccumulator
from ..training.model import unwrap_model
from .contents import (
    META_NAME,
    CheckpointContents,
    load_process_file,
    load_shared_files,
    read_meta,
    write_description,
    write_process_file,
    write_shared_files,
)
from .durable import crash_point, space_explained, sync_tree
from .folders import (
    CHECKPOINTS,
    checkpoint_number,
    commit,
    make_staging,
    next_checkpoint_number,
    numbered_checkpoints,
    prune,
    set_aside_copy,
)
from .model_files import safetensors_contents
from .model_io import save_model_files
from .sharded_files import load_sharded_parts, save_sharded_parts
from .state_hooks import StateHookMethods

__all__ = ["CheckpointMethods"]


def _all_succeeded(error: BaseException | None, what: str) -> None:
    """Collective: raise on every process when ``what`` failed on any of them (the failing
    process raises its own exception, the others say which process failed and why)."""
    reports = gather_object([None if error is None else f"{type(error).__name__}: {error}"])
    if error is not None:
        raise error
    for rank, report in enumerate(reports):
        if report is not None:
            raise RuntimeError(f"{what} failed on process {rank}: {report}")


def _check_not_accumulating(accumulating: bool) -> None:
    if accumulating:
        raise ValueError(
            "save_state was called in the middle of gradient accumulation: with FSDP the "
            "gradients gathered so far are not kept in a checkpoint. Save on a step where "
            "accelerator.sync_gradients is True (after optimizer.step())"
        )


def _lacks_state_methods(obj: Any) -> str:
    """What ``obj`` lacks of ``state_dict()`` and ``load_state_dict()`` ("" when nothing)."""
    missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(obj, m, None))]
    if len(missing) == 2:
        return "has neither state_dict() nor load_state_dict()"
    return f"has no {missing[0]}()" if missing else ""


class CheckpointMethods(StateHookMethods):
    """Mixin of :class:`Accelerator`: saving and restoring the whole training state."""

    project_configuration: ProjectConfiguration
    state: AcceleratorState
    scaler: Any | None
    _accumulator: GradientAccumulator
    _models: list[torch.nn.Module]
    _optimizers: list[Any]
    _schedulers: list[Any]
    _dataloaders: list[Any]
    _custom_objects: list[Any]
    _partial: PartialState
    gradient_state: GradientState

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named checkpoint gets: one past the highest
        ``checkpoint_<n>`` already in the project folder, and at least
        ``project_configuration.iteration``."""
        config = self.project_configuration
        if not config.automatic_checkpoint_naming or config.project_dir is None:
            return config.iteration
        return next_checkpoint_number(self._checkpoints_folder(), config.iteration)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Have :meth:`save_state` / :meth:`load_state` include ``objects`` (anything with
        ``state_dict()`` and ``load_state_dict()``), in this order.

        Raises ``ValueError`` naming every object that lacks one of the two methods (as
        Accelerate does), and registers none of them then.
        """
        problems = [
            f"- Item at index {index}, {type(obj).__name__}, {lacks}"
            for index, obj in enumerate(objects)
            if (lacks := _lacks_state_methods(obj))
        ]
        if problems:
            raise ValueError(
                "register_for_checkpointing takes objects with state_dict() and "
                "load_state_dict() methods:\n" + "\n".join(problems) + "\nGive them both "
                "methods (or wrap them in an object that has them), or save them yourself."
            )
        self._custom_objects.extend(objects)

    def _contents(self, models: list[torch.nn.Module] | None = None) -> CheckpointContents:
        if models is None:
            models = [unwrap_model(model) for model in self._models]
        return CheckpointContents(
            models=models,
            optimizers=list(self._optimizers),
            schedulers=list(self._schedulers),
            dataloaders=list(self._dataloaders),
            custom=list(self._custom_objects),
            scaler=self.scaler,
            step=self._accumulator.step,
            accumulating=self._accumulator.step % self.gradient_state.num_steps != 0,
            sharded=self.state.sharding.checkpoint_layout(models),
        )

    def _checkpoints_folder(self) -> Path:
        project_dir = self.project_configuration.project_dir
        if project_dir is None:
            raise ValueError(
                "automatic_checkpoint_naming needs a project folder: "
                "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)"
            )
        return Path(project_dir).expanduser() / CHECKPOINTS

    def _output_target(self, output_dir: str | os.PathLike[str] | None) -> Path | None:
        """The folder ``save_state`` writes, or None with automatic naming (whose folder the
        main process chooses); every process checks the arguments."""
        if self.project_configuration.automatic_checkpoint_naming:
            self._checkpoints_folder()  # a project folder is needed
            return None
        if output_dir is None:
            raise ValueError(
                "save_state needs an output_dir, or automatic checkpoint naming in a project "
                "folder: Accelerator(project_config=ProjectConfiguration(project_dir=..., "
                "automatic_checkpoint_naming=True))"
            )
        target = Path(output_dir).expanduser()
        if target.exists() and not (target / META_NAME).is_file():
            if not target.is_dir() or any(target.iterdir()):
                raise ValueError(
                    f"{target} exists and is not a checkpoint folder: save_state replaces its "
                    "folder whole, so give it a new (or empty) folder, or an earlier checkpoint's"
                )
        return target

    def _stage(self, target: Path | None) -> tuple[Path, Path]:
        """Collective: the checkpoint's final folder and its staging folder, made by the main
        process. An automatic name is numbered past every checkpoint already in the folder."""
        staging: Path | None = None
        error: BaseException | None = None
        where = target.parent if target is not None else self._checkpoints_folder()
        if self._partial.is_main_process:
            try:
                if target is None:
                    number = next_checkpoint_number(where, self.project_configuration.iteration)
                    target = where / f"checkpoint_{number}"
                staging = make_staging(target)
            except OSError as problem:
                error = problem
        _all_succeeded(error, f"creating the checkpoint folder in {where}")
        chosen, made = broadcast_object_list([str(target), str(staging)])
        return Path(chosen), Path(made)

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, the gradient scaler, registered objects, every
        process's random generators and each prepared loader's position; returns the folder.

        Call it on every process. The checkpoint appears whole or not at all: it is written
        into a hidden staging folder, every process flushes what it wrote to disk, the main
        process writes the description file (``nb_accel_checkpoint.json``) last and renames
        the folder into place in one step, so a crash at any point leaves the previous
        checkpoint or the new one, never a mix. Only the main process writes the shared
        files; each process writes its own ``random_states_<rank>.pkl``; everyone returns once
        the checkpoint is in place.

        With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folder is
        ``project_dir/checkpoints/checkpoint_<n>`` (``output_dir`` is ignored), ``n`` is one
        past the highest checkpoint already there (at least ``project_configuration.iteration``),
        so a rerun in the same folder continues the numbering and the newest checkpoint is
        always the last one written; beyond ``total_limit`` the oldest checkpoints are removed
        once the new one is in place, never the new one itself. An existing ``output_dir`` is
        replaced: swapped with the new folder in one step where the system allows it (Linux's
        local file systems), else renamed aside first and removed once the new one is in place
        (a load finds the copy set aside if a crash comes in between). Hooks registered with
        :meth:`register_save_state_pre_hook` run first, on every process, and what they write
        into their folder becomes part of the checkpoint.
        """
        if save_model_func_kwargs:
            raise TypeError(f"save_state() got unexpected options {sorted(save_model_func_kwargs)}")
        given = self._output_target(output_dir)
        target, staging = self._stage(given)
        if given is not None and given.resolve() != target.resolve():
            self._written_elsewhere(given, target)
        automatic = self.project_configuration.automatic_checkpoint_naming
        number = checkpoint_number(target)
        partial = self._partial
        error: BaseException | None = None
        device_random = None
        try:
            contents = self._contents(self._saved_models(str(staging)))
            if contents.sharded:  # collective: every process writes its shards first
                _check_not_accumulating(contents.accumulating)
                save_sharded_parts(self.state.sharding, staging, contents, safe_serialization)
            contents = partial.device_backend.contents_to_save(contents)  # XLA: through the CPU
            device_random = partial.device_backend.random_state()
            write_process_file(staging, contents, partial.process_index)
            if device_random is not None:
                device_random.write(staging, partial.process_index)
            if partial.is_main_process:
                write_shared_files(staging, contents, partial.num_processes, safe_serialization)
            sync_tree(staging)  # every process flushes what it wrote (and what it sees)
            crash_point("state-written")
        except Exception as problem:  # noqa: BLE001 - reported on every process below
            error = space_explained(problem, staging, f"checkpoint {target}", partial.process_index)
        try:
            _all_succeeded(error, f"writing checkpoint {target}")
            if partial.is_main_process:
                try:
                    write_description(staging, contents, partial.num_processes, safe_serialization)
                    crash_point("state-recorded")
                    commit(staging, target)
                    limit = self.project_configuration.total_limit
                    if automatic and limit and number is not None:
                        prune(target.parent, limit, newest=number)
                except OSError as problem:
                    error = space_explained(problem, staging, f"checkpoint {target}", 0)
            _all_succeeded(error, f"moving checkpoint {target} into place")
        finally:
            if partial.is_main_process and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        if automatic and number is not None:
            self.project_configuration.iteration = number + 1
        if device_random is not None:
            device_random.resume()
        return str(target)

    def _written_elsewhere(self, given: Path, target: Path) -> None:
        """This process named another folder than the main process: the checkpoint went to
        the main process's, and ``load_state(given)`` on this process will read it there."""
        self.__dict__.setdefault("_checkpoints_written_to", {})[str(given.resolve())] = target
        warnings.warn(
            f"save_state on process {self._partial.process_index} was given {given}, but a "
            f"checkpoint is written whole into the main process's folder {target}; "
            f"load_state({str(given)!r}) on this process reads it from there",
            stacklevel=3,
        )

    def _load_source(self, input_dir: str | os.PathLike[str] | None) -> Path:
        if input_dir is not None:
            folder = Path(input_dir).expanduser()
            if not folder.is_dir():
                return self._set_aside_or_missing(folder)
            written = self.__dict__.get("_checkpoints_written_to", {}).get(str(folder.resolve()))
            if written is not None and not (folder / META_NAME).is_file():
                return Path(written)
            return folder
        if not self.project_configuration.automatic_checkpoint_naming:
            raise ValueError(
                "load_state needs an input_dir, or automatic checkpoint naming in a project "
                "folder to load its newest checkpoint: Accelerator(project_config="
                "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True))"
            )
        parent = self._checkpoints_folder()
        found = numbered_checkpoints(parent)
        complete = [folder for folder in found if (folder / META_NAME).is_file()]
        if not complete:
            raise FileNotFoundError(f"no checkpoint in {parent} (save_state has not completed one)")
        newest = complete[-1]
        skipped = [folder.name for folder in found[found.index(newest) + 1 :]]
        if skipped:
            warnings.warn(
                f"load_state: {', '.join(skipped)} in {parent} is not a complete checkpoint "
                f"(no {META_NAME}: another tool wrote it, or it was copied in part); loading "
                f"{newest.name}, the newest complete one",
                stacklevel=3,
            )
        return newest

    def _set_aside_or_missing(self, folder: Path) -> Path:
        """The checkpoint ``folder`` names while it is missing: the previous copy that an
        interrupted replacement left aside, with a warning; else ``FileNotFoundError``."""
        aside = set_aside_copy(folder)
        if aside is None:
            raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
        warnings.warn(
            f"load_state: {folder} is missing because a save_state replacing it was "
            f"interrupted; loading the previous checkpoint, which it set aside as {aside.name} "
            "(the next save_state into this folder puts it back first)",
            stacklevel=4,
        )
        return aside

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> None:
        """Restore what :meth:`save_state` saved into the prepared and registered objects.

        Without ``input_dir`` (and with automatic checkpoint naming) the newest complete
        ``checkpoint_<n>`` is loaded (a newer folder that is not a complete checkpoint is
        passed over with a warning) and the next save becomes ``checkpoint_<n+1>``. A folder
        named by ``input_dir`` whose save never completed is refused; one that is missing
        because a save replacing it was interrupted is loaded from the previous copy set
        aside, with a warning. The
        checkpoint must come from a launch with the same number of processes and the same
        prepared and registered objects. A loader whose epoch was under way resumes it with
        the same shuffling; pass it through ``skip_first_batches`` to skip the batches
        already trained on. Files other than the weights are loaded with
        ``weights_only=True``; ``load_kwargs`` go to ``torch.load``.
        """
        if load_model_func_kwargs:
            raise TypeError(f"load_state() got unexpected options {sorted(load_model_func_kwargs)}")
        folder = self._load_source(input_dir)
        contents = self._contents(self._loaded_models(str(folder)))
        meta = read_meta(folder, contents, self._partial.num_processes)
        load_shared_files(folder, contents, meta, load_kwargs)
        if contents.sharded:  # collective
            safe = bool(meta.get("safe_serialization", True))
            load_sharded_parts(self.state.sharding, folder, contents, safe, load_kwargs)
        self._accumulator.step = load_process_file(
            folder, contents, self._partial.process_index, load_kwargs
        )
        self._partial.device_backend.restore_random_state(
            folder, self._partial.process_index, load_kwargs
        )
        number = checkpoint_number(folder)
        if self.project_configuration.automatic_checkpoint_naming and number is not None:
            self.project_configuration.iteration = number + 1

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Save ``model``'s weights (unwrapped) on the main process: ``model.safetensors``, or
        shards plus ``model.safetensors.index.json`` above ``max_shard_size``
        (``pytorch_model*.bin`` with ``safe_serialization=False``). Call
        :meth:`~ProcessMethods.wait_for_everyone` first so that training has finished
        everywhere; read it back with :func:`load_checkpoint_in_model`. A sharded (FSDP)
        model is gathered first: call it on every process then."""
        inner = unwrap_model(model)
        state = self.state.sharding.model_state_dict(inner)  # sharded: collective, to the main
        if not self._partial.is_main_process:
            return
        state = self._partial.device_backend.on_cpu(state)
        save_model_files(
            state,
            save_directory,
            max_shard_size=max_shard_size,
            safe_serialization=safe_serialization,
        )

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save ``obj`` once, from the main process (from each machine's main process with
        ``ProjectConfiguration(save_on_each_node=True)``): ``torch.save``, or a safetensors
        file when ``safe_serialization`` (``obj`` must then be a dict of tensors)."""
        save(obj, f, self.project_configuration.save_on_each_node, safe_serialization)


def save(
    obj: Any,
    f: str | os.PathLike[str],
    save_on_each_node: bool = False,
    safe_serialization: bool = False,
) -> None:
    """Save ``obj`` once, from the main process (each machine's with ``save_on_each_node``):
    ``torch.save``, or a safetensors file when ``safe_serialization`` (a dict of tensors).

    safetensors stores memory shared by several names (tied weights) once: the first name
    keeps it, the others are left out of the file with a warning naming them, and recorded in
    its header so that :func:`load_checkpoint_in_model` ties them again.
    """
    if safe_serialization and not isinstance(obj, Mapping):
        raise TypeError(
            f"safe_serialization=True saves a dict of tensors, not a {type(obj).__name__}: "
            "pass a state_dict(), or save it with safe_serialization=False"
        )
    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    obj = state.device_backend.on_cpu(obj)
    if safe_serialization:
        from safetensors.torch import save_file

        tensors, metadata, tied = safetensors_contents(obj)
        if tied:  # a logging record, as Accelerate's (its tests look for it with assertLogs)
            logging.getLogger(__name__).warning(_tied_note(tied))
        save_file(tensors, os.fspath(Path(f).expanduser()), metadata=metadata)
    else:
        torch.save(obj, Path(f).expanduser() if isinstance(f, (str, os.PathLike)) else f)


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load(f, map_location=map_location, **kwargs)``, as Accelerate's ``load``: where
    ``weights_only`` is on (torch's default), NumPy arrays in the file load too."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core  # type: ignore[attr-defined]  # NumPy 1
    dtypes = [type(np.dtype(kind)) for kind in ("bool", "int32", "int64", "float32", "float64")]
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]
    with torch.serialization.safe_globals(allowed):
        return torch.load(f, map_location=map_location, **kwargs)


def _tied_note(tied: dict[str, str]) -> str:
    """The warning for names left out of a safetensors file because they share memory."""
    pairs = ", ".join(f"{dropped!r} (same memory as {kept!r})" for dropped, kept in tied.items())
    return (
        f"Removed shared tensor(s) {pairs} while saving: save(safe_serialization=True) stored "
        "shared memory once; "
        "load_checkpoint_in_model ties them again; with safetensors' load_file, tie them "
        "after loading (or load the state dict with strict=False)"
    )
