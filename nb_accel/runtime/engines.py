"""Accelerate's classes for the engines nb_accel does not run: DeepSpeed, Megatron-LM, FP8
training, and the older tensor parallelism plugin (tensor parallelism itself runs through
``ParallelismConfig(tp_size=n)``). They import where Accelerate has them, so that code naming them
loads; making one raises ``NotImplementedError`` saying what nb_accel runs instead.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "DeepSpeedPlugin",
    "FP8RecipeKwargs",
    "MegatronLMPlugin",
    "TorchTensorParallelPlugin",
    "refuse_engines",
]

#: What nb_accel trains with, said in every refusal.
_INSTEAD = (
    "nb_accel trains with DistributedDataParallel, or shards the model with FSDP2: "
    "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())"
)


def refuse_engines(**engines: Any) -> None:
    """Accelerate's parameters for engines nb_accel does not run (``deepspeed_plugin``, ...):
    ``NotImplementedError`` for the first one given (not None)."""
    for name, value in engines.items():
        if value is not None:
            instead = _INSTEAD_OF.get(name, _ENGINES_INSTEAD)
            raise NotImplementedError(f"{name} is not supported by nb_accel; {instead}")


#: What a refused engine's parameter says nb_accel runs instead.
_ENGINES_INSTEAD = (
    "it runs DistributedDataParallel or FSDP2 (remove the argument, or pass "
    "fsdp_plugin=FullyShardedDataParallelPlugin() to shard the model)"
)

#: What to pass instead of an engine's parameter, where that is not :data:`_ENGINES_INSTEAD`.
_INSTEAD_OF: dict[str, str] = {
    "torch_tp_plugin": (
        "lay tensor parallelism out with parallelism_config=ParallelismConfig(tp_size=N) "
        "instead (the FSDP guide's tensor parallelism section has a whole example)"
    ),
}


class _Refused:
    """A class of an engine nb_accel does not run: making one is refused."""

    #: The engine, as the refusal names it.
    _engine: ClassVar[str]
    #: What to use instead.
    _instead: ClassVar[str] = _INSTEAD

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs
        raise NotImplementedError(
            f"{type(self).__name__}: {self._engine} is not supported by nb_accel; {self._instead}"
        )


class DeepSpeedPlugin(_Refused):
    """Accelerate's DeepSpeed options. nb_accel does not run DeepSpeed: making one raises
    ``NotImplementedError`` (FSDP2 shards parameters, gradients and optimizer state as ZeRO-3
    does)."""

    _engine = "DeepSpeed"


class MegatronLMPlugin(_Refused):
    """Accelerate's Megatron-LM options. nb_accel does not run Megatron-LM: making one raises
    ``NotImplementedError``."""

    _engine = "Megatron-LM"


class TorchTensorParallelPlugin(_Refused):
    """Accelerate's older tensor parallelism plugin: making one raises ``NotImplementedError``
    naming ``ParallelismConfig(tp_size=n)``, through which nb_accel runs tensor parallelism."""

    _engine = "this plugin"
    _instead = "lay tensor parallelism out with ParallelismConfig(tp_size=N) instead"


class FP8RecipeKwargs(_Refused):
    """Accelerate's FP8 recipe options. nb_accel does not train in FP8: making one raises
    ``NotImplementedError``."""

    _engine = "FP8 training"
    _instead = 'use Accelerator(mixed_precision="bf16") or "fp16"'
