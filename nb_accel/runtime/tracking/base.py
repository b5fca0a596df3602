"""The tracker interface: :class:`GeneralTracker`, the ``on_main_process`` rule, logged values.

A tracker is one destination of ``Accelerator.log``: TensorBoard, Weights & Biases, MLflow...,
the live chart in the cell, or a class of the user's own. Each says whether only the main
process uses it (``main_process_only``, the default) or every process does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..state import PartialState

__all__ = ["GeneralTracker", "on_main_process", "plain_values", "flat_numbers"]

F = TypeVar("F", bound=Callable[..., Any])


def on_main_process(function: F) -> F:
    """Decorator for a tracker's methods: run only on the main process when the tracker's
    ``main_process_only`` is true (read at call time), on every process otherwise."""

    @functools.wraps(function)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and not PartialState().is_main_process:
            return None
        return function(self, *args, **kwargs)

    return run  # type: ignore[return-value]


class GeneralTracker:
    """The base of every experiment tracker (subclass it for a tracker of your own).

    A subclass defines ``name`` (how ``log_with``, ``init_kwargs``, ``log_kwargs`` and
    ``get_tracker`` name it), ``requires_logging_directory`` (whether it is built with the
    Accelerator's ``logging_dir`` as its second argument) and a ``tracker`` property (the
    library's own object, which ``get_tracker(name, unwrap=True)`` returns). It may override
    :meth:`start`, :meth:`store_init_configuration`, :meth:`log` and :meth:`finish`.

    ``main_process_only = True`` (the default): only the main process starts, logs and finishes
    it. Set it to ``False`` for a tracker that every process uses.
    """

    main_process_only: bool = True
    name: str
    requires_logging_directory: bool
    if TYPE_CHECKING:  # a subclass defines it (checked when it is created)

        @property
        def tracker(self) -> Any:
            """The library's own object."""

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [
            f"`{attribute}`"
            for attribute in ("name", "requires_logging_directory", "tracker")
            if attribute not in dir(self)
        ]
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} is missing these tracker attributes: {', '.join(missing)}; "
                "define them in the class (name = '...', requires_logging_directory = False, "
                "and a `tracker` property returning the library's object)"
            )

    def start(self) -> None:
        """Create the run (called by ``init_trackers``, after the process group exists)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record ``values`` (the ``config`` of ``init_trackers``) as the run's hyperparameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``; ``kwargs`` come from ``log_kwargs={name: {...}}``."""

    def finish(self) -> None:
        """End the run and write out what is left (called by ``end_training``)."""

    def _where(self) -> str | None:
        """Where the run is written, for the line ``init_trackers`` prints (``None``: no line)."""
        return None

    def _finish_after_failure(self) -> None:
        """End the run after the function failed or was interrupted (a failed run where the
        library has the notion)."""
        self.finish()

    def _run_reference(self) -> tuple[str, str] | None:
        """The started run as another process can find it, ``(run_id, location)``, for the
        kernel to end it if this rank is stopped before it can (see :meth:`_end_left_open`);
        ``None`` (the default) where the library has no such notion."""
        return None

    @classmethod
    def _end_left_open(cls, run_id: str, location: str) -> bool:
        """In the kernel, after the rank that started run ``run_id`` at ``location`` was
        stopped without ending it: end it as killed; True when the run was still open and is
        ended now (by default nothing can be done: False)."""
        return False


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.tolist()
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


def plain_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every tensor, also inside dicts and lists, turned into Python numbers
    (a one-element tensor of no dimension becomes a number, others nested lists)."""
    return {str(key): _plain(value) for key, value in values.items()}


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, list) and len(value) == 1:
        return _number(value[0])
    return None


def flat_numbers(values: Mapping[str, Any], separator: str = "/") -> dict[str, float]:
    """The numbers in plain ``values``, nested dicts flattened to ``outer/inner`` names;
    one-element lists count as their number, other entries are left out."""
    found: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            for inner, number in flat_numbers(value, separator).items():
                found[f"{key}{separator}{inner}"] = number
            continue
        scalar = _number(value)
        if scalar is not None:
            found[str(key)] = scalar
    return found
