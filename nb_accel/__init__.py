"""nb_accel: launch distributed PyTorch training from a notebook cell.

``notebook_launcher`` runs a function on N worker processes; inside them ``Accelerator`` offers
Accelerate's documented training-loop API (``prepare``, ``backward``, ``gather_for_metrics``, ...).
"""

# ruff: noqa: E402 - the torch check runs before the imports that load torch

import os
from typing import TYPE_CHECKING

# torch.cuda.is_available() then asks NVML instead of initialising CUDA in this process, so
# that forked workers can still use the GPUs (set before anything can ask torch).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

from ._env import check_torch

check_torch()  # an older torch is refused here, saying what to do, before anything imports it

from ._version import __version__ as __version__
from .config import Config, load_config, save_config
from .errors import (
    CollectiveTimeoutError,
    LaunchError,
    NbAccelError,
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
)
from .launch import debug_launcher, notebook_launcher, stop_workers
from .launch.failures.user_errors import register_traceback_renderer
from .launch.failures.whereabouts import register_place_namer
from .launch.views.view import register_view_factory
from .notebook.compat_shell import note_cell_numbers
from .notebook.debug_magic import current_shell, install_debug_magic
from .notebook.launch_view import notebook_view
from .notebook.tracebacks import cell_place
from .notebook.tracebacks import render as render_traceback
from .runtime.accelerator import Accelerator
from .runtime.checkpoint.model_io import load_checkpoint_in_model
from .runtime.cuda_origin import watch_cuda_initialisation
from .runtime.data.loaders import (
    DataLoaderDispatcher,
    DataLoaderShard,
    prepare_data_loader,
    skip_first_batches,
)
from .runtime.data.rng import set_seed, synchronize_rng_states
from .runtime.data.sampling import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler
from .runtime.engines import DeepSpeedPlugin
from .runtime.environment import is_rich_available
from .runtime.fsdp.plugin import FullyShardedDataParallelPlugin
from .runtime.memory import find_executable_batch_size
from .runtime.options import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from .runtime.parallelism import ParallelismConfig
from .runtime.state import AcceleratorState, DistributedType, GradientState, PartialState
from .runtime.tracking.base import GeneralTracker
from .runtime.training.compile import TorchDynamoPlugin
from .runtime.training.optimizer import AcceleratedOptimizer
from .runtime.training.scheduler import AcceleratedScheduler
from .worker.reporting.progress import tqdm, trange
from .worker.warm.residents import drop_resident, resident

register_view_factory(notebook_view)
register_traceback_renderer(render_traceback)
register_place_namer(cell_place)
watch_cuda_initialisation()  # a kernel that initialises CUDA is told which line did it
install_debug_magic(current_shell())  # %debug after a rank's failure: that rank's frames
note_cell_numbers(current_shell())  # IPython 7: cells named as IPython 8 names them


if TYPE_CHECKING:  # for type checkers and the API reference; imported on use below
    from .notebook.config_widget import ConfigWidget


def __getattr__(name: str) -> object:
    """``ConfigWidget`` is imported on first use (it loads ipywidgets)."""
    if name == "ConfigWidget":
        from .notebook.config_widget import ConfigWidget

        return ConfigWidget
    raise AttributeError(f"module 'nb_accel' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext nb_accel``: register the ``%distributed`` and ``%%distributed`` magics."""
    from .notebook.magics import load_ipython_extension as register

    register(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext nb_accel`` (also run by ``%reload_ext``): stop the ``%%distributed`` pool."""
    from .notebook.magics import unload_ipython_extension as unregister

    unregister(ipython)


__all__ = [
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "ProfileKwargs",
    "TorchDynamoPlugin",
    "find_executable_batch_size",
    "is_rich_available",
    "synchronize_rng_states",
    "AcceleratedOptimizer",
    "Config",
    "ConfigWidget",
    "AcceleratedScheduler",
    "Accelerator",
    "AcceleratorState",
    "BatchSamplerShard",
    "CollectiveTimeoutError",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GeneralTracker",
    "GradientAccumulationPlugin",
    "GradientState",
    "IterableDatasetShard",
    "LaunchError",
    "NbAccelError",
    "ParallelismConfig",
    "PartialState",
    "ProjectConfiguration",
    "SeedableRandomSampler",
    "WorkerDiedError",
    "WorkerError",
    "WorkerFailure",
    "debug_launcher",
    "drop_resident",
    "resident",
    "stop_workers",
    "load_checkpoint_in_model",
    "load_config",
    "load_ipython_extension",
    "notebook_launcher",
    "prepare_data_loader",
    "save_config",
    "set_seed",
    "skip_first_batches",
    "tqdm",
    "trange",
]
