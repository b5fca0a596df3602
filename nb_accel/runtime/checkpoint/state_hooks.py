"""The Accelerator's hooks into save_state and load_state, and a prepared model's state dict."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ..state import AcceleratorState
from ..training.model import unwrap_model

__all__ = ["StateHookMethods"]


class StateHookMethods:
    """Mixin of :class:`Accelerator`: hooks run by ``save_state``/``load_state``, and
    :meth:`get_state_dict`."""

    _models: list[torch.nn.Module]
    state: AcceleratorState

    def _hooks(self, kind: str) -> OrderedDict[int, Callable[..., None]]:
        name = f"_nb_accel_{kind}_state_pre_hooks"
        hooks = self.__dict__.get(name)
        if hooks is None:
            hooks = OrderedDict()
            setattr(self, name, hooks)
        return hooks

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Have :meth:`save_state` call ``hook(models, weights, output_dir)`` before it writes.

        ``models`` is a list of the prepared models, ``weights`` a list of their (unwrapped)
        state dicts, in the same order, and ``output_dir`` the folder being written (the
        checkpoint is written into a hidden folder, renamed into place once complete, so what a
        hook writes there arrives together with the rest). A hook may save more files there,
        or save a model its own way and remove that model's entry from ``weights`` so that the
        checkpoint leaves it out (a matching load hook then removes it from ``models``).
        Hooks run in the order registered, on every process; the handle's ``remove()``
        unregisters the hook.
        """
        hooks = self._hooks("save")
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Have :meth:`load_state` call ``hook(models, input_dir)`` before it reads.

        ``models`` is a list of the prepared models and ``input_dir`` the checkpoint's folder.
        A hook that loads a model its own way removes it from ``models``, and the checkpoint's
        weights are then not loaded into it. Hooks run in the order registered, on every
        process; the handle's ``remove()`` unregisters the hook.
        """
        hooks = self._hooks("load")
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def _saved_models(self, output_dir: str) -> list[torch.nn.Module]:
        """Run the save hooks; the unwrapped models whose weights the checkpoint keeps."""
        models = [unwrap_model(model) for model in self._models]
        hooks = list(self._hooks("save").values())
        if not hooks:
            return models
        weights = [model.state_dict() for model in models]
        kept = list(weights)
        for hook in hooks:
            hook(list(self._models), kept, output_dir)
        return [m for m, w in zip(models, weights, strict=True) if any(w is k for k in kept)]

    def _loaded_models(self, input_dir: str) -> list[torch.nn.Module]:
        """Run the load hooks; the unwrapped models the checkpoint's weights go into."""
        models = list(self._models)
        for hook in list(self._hooks("load").values()):
            hook(models, input_dir)
        return [unwrap_model(model) for model in models]

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """``model``'s state dict, on every process: of the model as it was before
        :meth:`prepare` (``unwrap=True``), or of the prepared wrapper itself (its keys then
        start with ``module.`` under DistributedDataParallel).

        A sharded (FSDP) model's whole weights are gathered to the main process, on the CPU;
        the other processes get an empty dict. Call it on every process then.
        """
        inner = unwrap_model(model)
        sharding = self.state.sharding
        if sharding.is_sharded(inner):
            return sharding.model_state_dict(inner)
        return (inner if unwrap else model).state_dict()
