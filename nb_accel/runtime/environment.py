"""Accelerate's environment helpers: ``patch_environment``, ``clear_environment``,
``purge_accelerate_environment``, ``is_torch_version`` and the ``is_*_available`` checks.

The checks look for a package with ``importlib.util.find_spec`` and never import it, and none
of them initialises CUDA: they are safe in the kernel before a launch forks its workers.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
import operator
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .._flags import env_flag
from .device_types.cuda_facts import cuda_device_count

__all__ = [
    "clear_environment",
    "compare_versions",
    "purge_accelerate_environment",
    "is_torch_version",
    "is_cuda_available",
    "is_datasets_available",
    "is_mlflow_available",
    "is_rich_available",
    "is_tensorboard_available",
    "is_torch_xla_available",
    "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available",
    "is_transformers_available",
    "is_wandb_available",
    "patch_environment",
]


@contextmanager
def patch_environment(**kwargs: object) -> Iterator[None]:
    """Set each keyword as an environment variable (name upper-cased, value ``str()``-ed) for
    the ``with`` block; on leaving, each variable gets back its earlier value or is removed."""
    names = {key.upper(): str(value) for key, value in kwargs.items()}
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def clear_environment() -> Iterator[None]:
    """Empty ``os.environ`` for the ``with`` block, then put back exactly what it held."""
    before = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


#: The prefix of the variables :func:`purge_accelerate_environment` puts back.
_ACCELERATE_PREFIX = "ACCELERATE_"
#: Set on the functions :func:`purge_accelerate_environment` made, so none is wrapped twice.
_PURGING = "__nb_accel_purges_environment__"
T = TypeVar("T")


@contextmanager
def _accelerate_variables_kept() -> Iterator[None]:
    """Put every ``ACCELERATE_*`` variable back as it was on entering: those set inside are
    removed, those changed or removed inside get their value back."""
    before = {k: v for k, v in os.environ.items() if k.startswith(_ACCELERATE_PREFIX)}
    try:
        yield
    finally:
        for name in [k for k in os.environ if k.startswith(_ACCELERATE_PREFIX)]:
            if name not in before:
                del os.environ[name]
        os.environ.update(before)


def _purging(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _accelerate_variables_kept():
            return function(*args, **kwargs)

    setattr(wrapper, _PURGING, True)
    return wrapper


def _purge_test_methods(cls: type) -> None:
    """Wrap the ``test*`` methods ``cls`` has (its own and inherited) that are not wrapped."""
    for name in dir(cls):
        member = inspect.getattr_static(cls, name)
        if name.startswith("test") and inspect.isfunction(member):
            if not getattr(member, _PURGING, False):
                setattr(cls, name, _purging(member))


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Decorate a function, or a test class, so that the ``ACCELERATE_*`` environment variables
    it sets or changes (``TrainingArguments(fp16=True)`` sets ``ACCELERATE_MIXED_PRECISION``)
    are put back as they were when it returns or raises.

    On a class (``unittest.TestCase`` or a pytest class) each ``test*`` method is wrapped, also
    those its subclasses define.
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)  # type: ignore[arg-type,return-value]
    cls: type = func_or_cls
    _purge_test_methods(cls)
    own = cls.__dict__.get("__init_subclass__")

    def init_subclass(subclass: type, **kwargs: Any) -> None:
        if own is not None:
            own.__get__(None, subclass)(**kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)  # type: ignore[arg-type]
        _purge_test_methods(subclass)

    cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    return func_or_cls


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    ">": operator.gt,
}


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch's version with ``version``: ``is_torch_version(">=",
    "2.4")``. ``operation`` is one of ``<``, ``<=``, ``==``, ``!=``, ``>=``, ``>``."""
    compare = _COMPARISONS.get(operation)
    if compare is None:
        raise ValueError(
            f"is_torch_version: unknown operation {operation!r}; use one of "
            + ", ".join(repr(o) for o in _COMPARISONS)
        )
    import torch

    return compare(torch.torch_version.TorchVersion(torch.__version__), version)


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """Compare an installed library's version (by its distribution name) or a version (a
    ``packaging`` ``Version`` or its text) with ``requirement_version``:
    ``compare_versions("transformers", ">=", "4.52.0")``."""
    from packaging.version import Version, parse

    compare = _COMPARISONS.get(operation)
    if compare is None:
        raise ValueError(
            f"compare_versions: unknown operation {operation!r}; use one of "
            + ", ".join(repr(o) for o in _COMPARISONS)
        )
    found = library_or_version
    if isinstance(found, str):
        try:
            found = parse(importlib.metadata.version(found))
        except importlib.metadata.PackageNotFoundError:
            found = parse(found)  # a version given as text
    if not isinstance(found, Version):
        found = parse(str(found))
    return compare(found, parse(requirement_version))


def _installed(module: str, distribution: str | None = None) -> bool:
    """True when ``module`` can be imported and comes from an installed distribution (a folder
    of that name on the path is not the library)."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):
        return False
    try:
        importlib.metadata.distribution(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def is_cuda_available() -> bool:
    """True when a CUDA device is visible, asked without initialising CUDA in this process."""
    return cuda_device_count() > 0


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """True when ``torch_xla`` is installed (it is not imported).

    With ``check_is_tpu`` (or ``check_is_gpu``), also that XLA would run on a TPU (a GPU), read
    from ``PJRT_DEVICE`` as torch_xla reads it, or, when that is unset, from the TPU's devices.
    """
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available: pass check_is_tpu or check_is_gpu, not both")
    if not _installed("torch_xla"):
        return False
    device = os.environ.get("PJRT_DEVICE", "").upper()
    if check_is_gpu:
        return device in ("GPU", "CUDA")
    if check_is_tpu:
        if device:
            return device == "TPU"
        return bool(os.environ.get("TPU_ACCELERATOR_TYPE")) or any(
            os.path.exists(path) for path in ("/dev/accel0", "/dev/vfio/0")
        )
    return True


def is_tensorboard_available() -> bool:
    """True when ``tensorboard`` or ``tensorboardX`` is installed."""
    return _installed("tensorboard") or _installed("tensorboardX")


def is_wandb_available() -> bool:
    """True when ``wandb`` is installed."""
    return _installed("wandb")


def is_mlflow_available() -> bool:
    """True when ``mlflow`` (or ``mlflow-skinny``) is installed."""
    return _installed("mlflow") or _installed("mlflow", "mlflow-skinny")


def is_transformers_available() -> bool:
    """True when ``transformers`` is installed."""
    return _installed("transformers")


def is_datasets_available() -> bool:
    """True when ``datasets`` is installed."""
    return _installed("datasets")


def is_torchdata_available() -> bool:
    """True when ``torchdata`` is installed."""
    return _installed("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """True when ``torchdata`` 0.8 or newer is installed: the version with
    ``torchdata.stateful_dataloader.StatefulDataLoader``, which prepared loaders are built on
    with ``DataLoaderConfiguration(use_stateful_dataloader=True)``."""
    if not _installed("torchdata"):
        return False
    release = importlib.metadata.version("torchdata").split("+")[0].split(".")
    try:
        major, minor = int(release[0]), int(release[1])
    except (IndexError, ValueError):
        return False
    return (major, minor) >= (0, 8)


def is_rich_available() -> bool:
    """True when ``rich`` is installed and ``ACCELERATE_ENABLE_RICH`` is set to a true value."""
    return bool(env_flag("ACCELERATE_ENABLE_RICH", default=False)) and _installed("rich")


def is_pytest_available() -> bool:
    """True when ``pytest`` is installed."""
    return _installed("pytest")


def is_mps_available(min_version: str | None = None) -> bool:
    """True when torch can use Apple's Metal (MPS) device here (``min_version`` is accepted for
    compatibility: torch's MPS check already covers what the installed torch supports)."""
    del min_version
    import torch

    return bool(torch.backends.mps.is_available())


def is_xpu_available(check_device: bool = False) -> bool:
    """True when torch can use an Intel GPU (XPU) here; ``check_device`` is accepted for
    compatibility (torch's check already looks for a device)."""
    del check_device
    import torch

    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def _vendor_device(module: str) -> bool:
    """Devices torch reaches through a vendor's extension (Habana, Ascend, ...): never used by
    nb_accel, reported as absent unless that extension is installed."""
    return _installed(module)


def is_hpu_available(init_hccl: bool = False) -> bool:
    """True when Habana's torch extension is installed (nb_accel does not launch on HPUs)."""
    del init_hccl
    return _vendor_device("habana_frameworks")


def is_npu_available(check_device: bool = False) -> bool:
    """True when Ascend's ``torch_npu`` is installed (nb_accel does not launch on NPUs)."""
    del check_device
    return _vendor_device("torch_npu")


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True when bfloat16 works on this machine's device: on CUDA when the GPU supports it, on
    a TPU unless ``ignore_tpu``, and on the CPU always."""
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if is_cuda_available():
        import torch

        return bool(torch.cuda.is_bf16_supported())
    return True


def is_fp16_available() -> bool:
    """True: float16 mixed precision works on CUDA, XLA and (through torch's CPU autocast and
    ``GradScaler("cpu")``) on the CPU."""
    return True


def is_deepspeed_available() -> bool:
    """True when ``deepspeed`` is installed (nb_accel does not train with it)."""
    return _installed("deepspeed")


def is_peft_available() -> bool:
    """True when ``peft`` is installed."""
    return _installed("peft")


def is_bnb_available() -> bool:
    """True when ``bitsandbytes`` is installed."""
    return _installed("bitsandbytes")


def is_ipex_available() -> bool:
    """True when Intel's extension for PyTorch is installed (nb_accel does not use it)."""
    return _installed("intel_extension_for_pytorch")


def is_trackio_available() -> bool:
    """True when ``trackio`` is installed."""
    return _installed("trackio")


def is_aim_available() -> bool:
    """True when ``aim`` is installed."""
    return _installed("aim")


def is_comet_ml_available() -> bool:
    """True when ``comet_ml`` is installed."""
    return _installed("comet_ml", "comet-ml")


def is_clearml_available() -> bool:
    """True when ``clearml`` is installed."""
    return _installed("clearml")


def is_dvclive_available() -> bool:
    """True when ``dvclive`` is installed."""
    return _installed("dvclive")


def is_swanlab_available() -> bool:
    """True when ``swanlab`` is installed."""
    return _installed("swanlab")
