"""``torch.compile`` for prepared models: Accelerate's ``TorchDynamoPlugin`` and ``DynamoBackend``.

A prepared model is compiled after the sharding strategy wraps it (in
``DistributedDataParallel``, as in Accelerate, so that torch's DDP optimizer splits the graph at
the gradient buckets), or before where the strategy says so (see
``DataParallelStrategy.compiles_before_wrap``).
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..._flags import env_flag
from ..enums import _NamedEnum
from ..options import KwargsHandler

__all__ = [
    "DynamoBackend",
    "TorchDynamoPlugin",
    "compile_model",
    "compile_regions",
    "dynamo_plugin_from",
    "has_compiled_regions",
    "is_compiled_module",
]

_ENV = "ACCELERATE_DYNAMO_"


class DynamoBackend(str, _NamedEnum):
    """A ``torch.compile`` backend, by Accelerate's names (``NO`` compiles nothing).

    ``INDUCTOR`` generates kernels (C++ on the CPU: it needs a C++ compiler, ``g++``);
    ``AOT_EAGER`` and ``EAGER`` trace without generating code (useful to check a model
    compiles). The others need the library they name.
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


def _env_flag(name: str) -> bool | None:
    return env_flag(_ENV + name)


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """How ``prepare()`` compiles models with ``torch.compile``.

    Fields left as ``None`` take Accelerate's environment variables
    (``ACCELERATE_DYNAMO_BACKEND``, ``_MODE``, ``_USE_FULLGRAPH``, ``_USE_DYNAMIC``), then
    torch's defaults.

    Attributes:
        backend: a :class:`DynamoBackend` or its name in any case (``"inductor"``); ``"no"``
            (the default) compiles nothing.
        mode: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` or
            ``"max-autotune-no-cudagraphs"``.
        fullgraph: fail on a graph break instead of running that part eagerly.
        dynamic: trace with dynamic shapes (``None``: torch decides).
        options: a dictionary of backend options (not together with ``mode``).
        disable: make ``torch.compile`` a no-op (for testing).
        use_regional_compilation: accepted for compatibility; the whole model is compiled.
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        chosen = self.backend if self.backend is not None else os.environ.get(_ENV + "BACKEND")
        chosen = chosen or "no"
        try:
            self.backend = DynamoBackend(str(getattr(chosen, "value", chosen)).upper())
        except ValueError:
            names = ", ".join(repr(b.value.lower()) for b in DynamoBackend)
            raise ValueError(
                f"TorchDynamoPlugin: unknown dynamo backend {chosen!r}; use one of {names}"
            ) from None
        if self.mode is None:
            self.mode = os.environ.get(_ENV + "MODE", "default")
        if self.fullgraph is None:
            self.fullgraph = bool(_env_flag("USE_FULLGRAPH"))
        if self.dynamic is None:
            self.dynamic = _env_flag("USE_DYNAMIC")
        if self.use_regional_compilation is None:
            self.use_regional_compilation = bool(_env_flag("USE_REGIONAL_COMPILATION"))

    @property
    def enabled(self) -> bool:
        """True when prepared models are compiled (a backend other than ``"no"``)."""
        return self.backend is not DynamoBackend.NO

    def to_dict(self) -> dict[str, Any]:
        """Every field, the backend as its lower-case name."""
        fields = asdict(self)
        fields["backend"] = str(self.backend).lower()
        return fields

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.compile``: the backend, and the options that differ
        from torch's defaults."""
        kwargs: dict[str, Any] = {"backend": str(self.backend).lower()}
        if self.mode not in (None, "default"):
            kwargs["mode"] = self.mode
        if self.fullgraph:
            kwargs["fullgraph"] = True
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        if self.options is not None:
            kwargs["options"] = self.options
        if self.disable:
            kwargs["disable"] = True
        return kwargs


def is_compiled_module(module: Any) -> bool:
    """True for the wrapper ``torch.compile`` returns around a module (never loads dynamo:
    before it is loaded, nothing is compiled)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return optimized is not None and isinstance(module, optimized)


def _is_repeated_blocks(module: torch.nn.Module) -> bool:
    """True for a ``ModuleList`` of blocks that are all of one class."""
    kinds = {type(child) for child in module.children()}
    return isinstance(module, torch.nn.ModuleList) and len(kinds) == 1


def _holds_repeated_blocks(module: torch.nn.Module) -> bool:
    return any(_is_repeated_blocks(inner) for inner in module.modules())


def _compiled_regions(module: torch.nn.Module, options: dict[str, Any]) -> torch.nn.Module:
    if _is_repeated_blocks(module):
        blocks = [torch.compile(block, **options) for block in module.children()]
        return torch.nn.ModuleList(blocks)  # type: ignore[arg-type]
    if not _holds_repeated_blocks(module):
        return torch.compile(module, **options)  # type: ignore[return-value]
    copy = type(module).__new__(type(module))
    copy.__dict__.update(module.__dict__)
    for name, value in module.__dict__.items():  # methods bound to the module, bound to the copy
        if isinstance(value, types.MethodType) and value.__self__ is module:
            copy.__dict__[name] = types.MethodType(value.__func__, copy)
    copy._parameters = dict(module._parameters)
    copy._buffers = dict(module._buffers)
    copy._modules = {
        name: None if child is None else _compiled_regions(child, options)
        for name, child in module._modules.items()
    }
    return copy


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compile ``module`` region by region, as Accelerate does: each block of a ``ModuleList``
    of blocks of one class (a transformer's layers) is compiled on its own, so that torch
    compiles the first and reuses the result for the others; what holds no such list is
    compiled whole. ``compile_kwargs`` go to ``torch.compile``.

    Returns a new module sharing ``module``'s parameters (``module`` is left as it is); its
    ``_orig_mod`` is ``module``, which ``unwrap_model`` gives back.
    """
    regional = _compiled_regions(module, compile_kwargs)
    if not is_compiled_module(regional):
        regional.__dict__["_orig_mod"] = module
    return regional


def has_compiled_regions(module: Any) -> bool:
    """True for a module :func:`compile_regions` made (not for a whole compiled one)."""
    return isinstance(module, torch.nn.Module) and isinstance(
        module.__dict__.get("_orig_mod"), torch.nn.Module
    )


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin | None) -> torch.nn.Module:
    """``torch.compile(model)`` with the plugin's options (``model`` itself when the plugin
    compiles nothing or ``model`` is compiled already)."""
    if plugin is None or not plugin.enabled or is_compiled_module(model):
        return model
    if plugin.use_regional_compilation:
        warnings.warn(
            "TorchDynamoPlugin(use_regional_compilation=True): nb_accel compiles the whole "
            "model instead of its repeated blocks",
            stacklevel=4,
        )
    return torch.compile(model, **plugin.to_kwargs())  # type: ignore[return-value]


def dynamo_plugin_from(
    backend: DynamoBackend | str | None, plugin: TorchDynamoPlugin | None
) -> TorchDynamoPlugin:
    """The ``Accelerator``'s compile options from ``dynamo_backend`` or ``dynamo_plugin``."""
    if backend is not None and plugin is not None:
        raise ValueError("pass either dynamo_backend or dynamo_plugin to Accelerator, not both")
    return plugin if plugin is not None else TorchDynamoPlugin(backend=backend)
