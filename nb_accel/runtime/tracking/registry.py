"""Which trackers exist, which are installed, and which ones ``log_with`` asks for.

Each built-in tracker's library is an optional extra of nb_accel, imported only when its
tracker starts. Asking for one that is not installed fails when the ``Accelerator`` is
created, before any training, with the extra to install.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import warnings
from typing import Any

from ..._registry import Registry
from ..enums import LoggerType
from .base import GeneralTracker
from .hosted_trackers import ClearMLTracker, CometMLTracker, SwanLabTracker, TrackioTracker
from .local_trackers import AimTracker, DVCLiveTracker
from .mlflow_tracker import MLflowTracker
from .tensorboard_tracker import TensorBoardTracker
from .wandb_tracker import WandBTracker

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "MissingTrackerLibraryError",
    "filter_trackers",
    "get_available_trackers",
    "register_tracker_class",
]

#: The trackers nb_accel brings, by name (each imports its library only when it starts).
_BUILT_IN: dict[str, type[GeneralTracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "mlflow": MLflowTracker,
    "trackio": TrackioTracker,
    "aim": AimTracker,
    "comet_ml": CometMLTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
    "swanlab": SwanLabTracker,
}


def _tracker_class(name: str, found: object) -> type[GeneralTracker]:
    """A declared or built-in tracker class, checked."""
    if not (isinstance(found, type) and issubclass(found, GeneralTracker)):
        raise TypeError(f"tracker {name!r}: {found!r} is not a GeneralTracker subclass")
    return found


LOGGER_TYPE_TO_CLASS: Registry[type[GeneralTracker]] = Registry(
    "tracker",
    built_in=_BUILT_IN,
    group="nb_accel.trackers",
    load=_tracker_class,
    in_workers=True,
)
"""Tracker classes by name: those registered with :func:`register_tracker_class` (newest
first), those installed packages declare (``nb_accel.trackers`` entry points), the built-in
ones; read as a mapping, as Accelerate's dict of the same name."""

#: A built-in tracker's library: (module, distribution) pairs any of which will do, the pip
#: package to name, and nb_accel's extra that installs it.
_LIBRARIES: dict[str, tuple[tuple[tuple[str, str], ...], str, str]] = {
    "tensorboard": ((("tensorboard", "tensorboard"),), "tensorboard", "tensorboard"),
    "wandb": ((("wandb", "wandb"),), "wandb", "wandb"),
    "mlflow": ((("mlflow", "mlflow"), ("mlflow", "mlflow-skinny")), "mlflow", "mlflow"),
    "trackio": ((("trackio", "trackio"),), "trackio", "trackio"),
    "aim": ((("aim", "aim"),), "aim", "aim"),
    "comet_ml": ((("comet_ml", "comet-ml"),), "comet-ml", "comet_ml"),
    "clearml": ((("clearml", "clearml"),), "clearml", "clearml"),
    "dvclive": ((("dvclive", "dvclive"),), "dvclive", "dvclive"),
    "swanlab": ((("swanlab", "swanlab"),), "swanlab", "swanlab"),
}


class MissingTrackerLibraryError(ImportError):
    """``log_with`` names a tracker whose library is not installed."""


def _installed(module: str, distribution: str) -> bool:
    """``module`` importable from an installed distribution (a folder named like the library,
    such as the ``wandb/`` runs folder, does not count)."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
        importlib.metadata.distribution(distribution)
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return False
    return True


def is_tracker_installed(name: str) -> bool:
    """True when the library of the built-in tracker ``name`` is installed (not imported)."""
    return any(_installed(module, dist) for module, dist in _LIBRARIES[name][0])


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose library is installed (what ``log_with="all"`` starts)."""
    return [LoggerType(name) for name in _LIBRARIES if is_tracker_installed(name)]


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` build this :class:`GeneralTracker` subclass, as
    for a built-in one: ``tracker_class(project_name, **init_kwargs[name])``, with
    ``logging_dir`` second when it has ``requires_logging_directory = True``."""
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(
            f"register_tracker_class takes a GeneralTracker subclass, not {tracker_class!r}"
        )
    if not getattr(tracker_class, "name", None):
        raise ValueError(
            f"{tracker_class.__name__} needs a `name` class attribute to be registered"
        )
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            f"{tracker_class.__name__} needs a `requires_logging_directory` class attribute "
            "(True when it writes into the Accelerator's logging_dir)"
        )
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"register_tracker_class: {tracker_class.__name__} replaces the tracker named "
            f"{tracker_class.name!r}",
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS.register(str(tracker_class.name), tracker_class)


def _missing(name: str) -> MissingTrackerLibraryError:
    _, package, extra = _LIBRARIES[name]
    return MissingTrackerLibraryError(
        f"log_with={name!r} needs the {package} package, which is not installed: "
        f"pip install 'nb_accel[{extra}]' (or pip install {package}), then run again"
    )


def _names(log_with: Any) -> list[Any]:
    if log_with is None:
        return []
    return list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]


def _name_of(entry: Any) -> str:
    return str(entry.value) if isinstance(entry, LoggerType) else str(entry)


def filter_trackers(
    log_with: Any, logging_dir: str | os.PathLike[str] | None = None
) -> list[str | GeneralTracker]:
    """The trackers ``log_with`` asks for, each once: names of tracker classes and the
    :class:`GeneralTracker` instances given. ``"all"`` is every built-in tracker installed
    (with the instances given). A name not installed, unknown, or needing a ``logging_dir``
    there is none of, is refused here."""
    entries = _names(log_with)
    chosen: list[str | GeneralTracker] = [e for e in entries if isinstance(e, GeneralTracker)]
    if any(not isinstance(e, GeneralTracker) and _name_of(e) == "all" for e in entries):
        return chosen + _all_installed(logging_dir)
    chosen = []
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            chosen.append(entry)
            continue
        name = _name_of(entry)
        if name not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(
                f"log_with={entry!r} is no tracker nb_accel knows: choose among "
                f"{sorted(LOGGER_TYPE_TO_CLASS)}, 'all', or pass a GeneralTracker"
            )
        if name in chosen:
            continue
        if name in _LIBRARIES and LOGGER_TYPE_TO_CLASS[name] is _BUILT_IN[name]:
            if not is_tracker_installed(name):
                raise _missing(name)
        if LOGGER_TYPE_TO_CLASS[name].requires_logging_directory and logging_dir is None:
            raise ValueError(
                f"Logging with `{name}` requires a `logging_dir` (it writes into a folder): "
                "pass Accelerator(project_dir=...) or "
                "project_config=ProjectConfiguration(logging_dir=...)"
            )
        chosen.append(name)
    return chosen


def _all_installed(logging_dir: str | os.PathLike[str] | None) -> list[str | GeneralTracker]:
    found: list[str | GeneralTracker] = []
    for tracker in get_available_trackers():
        name = str(tracker.value)
        if LOGGER_TYPE_TO_CLASS[name].requires_logging_directory and logging_dir is None:
            warnings.warn(
                f"log_with='all' leaves out {name}: it writes into a folder and the Accelerator "
                "has none (pass project_dir=... to include it)",
                stacklevel=4,
            )
            continue
        found.append(name)
    return found
