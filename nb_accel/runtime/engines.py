"""Accelerate's classes for the engines nb_accel does not run: DeepSpeed, Megatron-LM, tensor
parallelism and FP8 training. They import where Accelerate has them, so that code naming them
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
            raise NotImplementedError(
                f"{name} is not supported by nb_accel; it runs DistributedDataParallel or "
                "FSDP2 (remove the argument, or pass fsdp_plugin=FullyShardedDataParallel"
                "Plugin() to shard the model)"
            )


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
    """Accelerate's tensor parallelism plugin. nb_accel does not run tensor parallelism:
    making one raises ``NotImplementedError``."""

    _engine = "tensor parallelism"


class FP8RecipeKwargs(_Refused):
    """Accelerate's FP8 recipe options. nb_accel does not train in FP8: making one raises
    ``NotImplementedError``."""

    _engine = "FP8 training"
    _instead = 'use Accelerator(mixed_precision="bf16") or "fp16"'
