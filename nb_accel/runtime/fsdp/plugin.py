"""``FullyShardedDataParallelPlugin``: the sharding options, with Accelerate's fields and names.

Fields left as ``None`` are read from the ``FSDP_*`` environment variables Accelerate's launcher
sets (``FSDP_RESHARD_AFTER_FORWARD``, ``FSDP_AUTO_WRAP_POLICY``, ...), then take the defaults
below. The engine is PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``): FSDP1-only options
are accepted and said once, with the reason, to have no effect (:mod:`.notices`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._flags import parse_flag

__all__ = [
    "FSDP1_ONLY",
    "FSDP1_WHY",
    "FullyShardedDataParallelPlugin",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "STATE_DICT_TYPES",
    "WRAP_POLICIES",
]

#: The named wrap policies (``auto_wrap_policy`` as a string, or ``FSDP_AUTO_WRAP_POLICY``).
WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
#: What ``save_state`` writes: full weights on the main process, or each rank's shards.
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
# FSDP1's sharding strategies, by name and by Accelerate's numbering (1-based)
_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
#: Options of FSDP1 that FSDP2 has no use for (accepted, said to have no effect), and why.
FSDP1_WHY = {
    "backward_prefetch": "FSDP2 always gathers the next unit's parameters ahead in the backward "
    "pass (FSDP1's BACKWARD_PRE)",
    "state_dict_config": "state_dict_type chooses what save_state writes",
    "optim_state_dict_config": "state_dict_type chooses what save_state writes",
    "limit_all_gathers": "FSDP2 holds at most the next unit's gathered parameters ahead by "
    "itself, without FSDP1's rate limiter",
    "use_orig_params": "FSDP2 always keeps the model's own parameters (as DTensor shards)",
    "param_init_fn": "a model built on the meta device gets rank 0's weights in prepare() "
    "(cpu_ram_efficient_loading=True)",
    "sync_module_states": "prepare() always starts every process from rank 0's weights",
    "forward_prefetch": "FSDP2 has no such switch (it gathers each unit's parameters as the "
    "forward pass reaches it)",
}
#: Options of FSDP1 that FSDP2 has no use for (accepted, said to have no effect).
FSDP1_ONLY = tuple(FSDP1_WHY)
_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


def _env(name: str) -> str | None:
    value = os.environ.get("FSDP_" + name)
    return value if value not in (None, "") else None


def _dtype(value: object, name: str) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    found = _DTYPES.get(str(value).lower().removeprefix("torch."))
    if found is None:
        raise ValueError(f"{name}={value!r} is not a dtype; use 'bf16', 'fp16' or 'fp32'")
    return found


@dataclass
class FullyShardedDataParallelPlugin:
    """How :meth:`Accelerator.prepare` shards models with FSDP2 (PyTorch's ``fully_shard``):
    parameters, gradients and optimizer state are split across the processes, each holding
    1/N of them, and gathered layer by layer for the forward and backward passes.

    Args:
        fsdp_version: 2 (FSDP2). 1 is accepted and runs as FSDP2, with a note.
        reshard_after_forward: free the gathered parameters after each layer's forward (less
            memory; the backward gathers them again). Default True. FSDP1's
            ``sharding_strategy`` names map onto it (``"FULL_SHARD"``: True,
            ``"SHARD_GRAD_OP"``: False).
        auto_wrap_policy: which submodules become their own sharded unit:
            ``"transformer_based_wrap"`` (the classes named in ``transformer_cls_names_to_wrap``,
            or a 🤗 model's ``_no_split_modules``), ``"size_based_wrap"`` (submodules with at least
            ``min_num_params`` parameters), ``"no_wrap"`` (the whole model as one unit), torch's
            ``transformer_auto_wrap_policy``/``size_based_auto_wrap_policy`` (or a ``partial`` of
            them), or a function ``policy(module) -> bool``. Default (``None``): by layer class,
            as ``"transformer_based_wrap"``. Whenever the layer classes are left to find (no
            ``transformer_cls_names_to_wrap``, no ``transformer_layer_cls``: this default, the
            name, torch's policy, Accelerate's own plugin), they are a 🤗 model's
            ``_no_split_modules``, else torch's ``nn.TransformerEncoderLayer``/
            ``nn.TransformerDecoderLayer``; when the model has neither, the named policies are
            an error listing its classes and the default says once that the whole model is one
            unit.
        transformer_cls_names_to_wrap: class names for ``"transformer_based_wrap"`` and the
            default (a list, or one comma-separated string); said to have no effect with the
            other policies.
        min_num_params: the size threshold of ``"size_based_wrap"`` (said to have no effect
            with the other policies).
        cpu_offload: keep the sharded parameters, gradients and optimizer state in CPU memory
            (a GPU launch; on a CPU launch it is said once to have no effect). ``True`` or a
            ``CPUOffloadPolicy``. The collectives on the offloaded tensors need a CPU backend
            beside NCCL: an FSDP launch on GPUs (``fsdp=True``, the saved ``sharding: fsdp``,
            or ``FSDP_OFFLOAD_PARAMS=true`` in the kernel) makes its process group
            ``"cuda:nccl,cpu:gloo"``; a plugin that offloads in a launch whose group is NCCL
            alone is refused when the model is prepared, saying so.
        mixed_precision_policy: the dtypes FSDP computes and reduces gradients in: a
            ``torch.distributed.fsdp.MixedPrecisionPolicy``, a dict
            (``{"param_dtype": "bf16", "reduce_dtype": "fp32"}``) or one dtype name. Default: from
            the Accelerator's ``mixed_precision`` (``"bf16"``: bf16 parameters, fp32 reductions).
            A dict's ``buffer_dtype`` (FSDP1's) is said to have no effect: FSDP2 leaves buffers
            in their own dtype.
        activation_checkpointing: recompute each wrapped layer's activations in the backward
            pass instead of keeping them (less memory, more compute): each unit below the model
            runs inside torch's ``checkpoint_wrapper``, so its forward runs twice per step.
        activation_checkpointing_offload: with ``activation_checkpointing``, also keep what each
            checkpointed unit saves for its recompute (its inputs) in CPU memory until the
            backward pass needs it (torch's ``offload_wrapper`` around the checkpointed unit):
            less accelerator memory for long sequences, at the cost of copies to and from the
            host. Same numbers as without it.
        state_dict_type: what ``save_state`` writes: ``"SHARDED_STATE_DICT"`` (default; every
            process writes its shards through ``torch.distributed.checkpoint``) or
            ``"FULL_STATE_DICT"`` (the main process writes whole weights and optimizer state).
        cpu_ram_efficient_loading: only the main process needs real weights: the others may
            build the model on the ``meta`` device, and prepare() fills their shards from the main
            process's weights.
        ignored_modules: submodules left out of sharding (their parameters are neither sharded
            nor averaged across processes): modules, or a regular expression of their names.
        sharding_strategy: FSDP1's name for ``reshard_after_forward`` (see there).

    The other FSDP1 options (``backward_prefetch``, ``use_orig_params``,
    ``sync_module_states``, ``limit_all_gathers``, ``forward_prefetch``, ``state_dict_config``,
    ``optim_state_dict_config``, ``param_init_fn``) are accepted; each given is said once, with
    the reason, to have no effect under FSDP2.
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: bool | str | None = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Callable[..., Any] | str | None = None
    cpu_offload: Any = None
    ignored_modules: Iterable[torch.nn.Module] | str | None = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool | None = None
    use_orig_params: bool | None = None
    param_init_fn: Callable[..., Any] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    notes: list[tuple[str, str]] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        version = self.fsdp_version if self.fsdp_version is not None else _env("VERSION") or 2
        if str(version) not in ("1", "2"):
            raise ValueError(f"fsdp_version={version!r}: use 2 (FSDP2; 1 is run as FSDP2)")
        if str(version) == "1":
            self.notes.append(("fsdp_version=1", "runs as FSDP2 (torch's fully_shard)"))
        self.fsdp_version = 2
        self._set_resharding()
        self.cpu_offload = self._resolve_flag(self.cpu_offload, "OFFLOAD_PARAMS", keep_objects=True)
        self.activation_checkpointing = self._resolve_flag(
            self.activation_checkpointing, "ACTIVATION_CHECKPOINTING"
        )
        self.activation_checkpointing_offload = self._resolve_flag(
            self.activation_checkpointing_offload, "ACTIVATION_CHECKPOINTING_OFFLOAD"
        )
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError(
                "activation_checkpointing_offload=True needs activation_checkpointing=True"
            )
        given_loading = self.cpu_ram_efficient_loading is not None
        self.cpu_ram_efficient_loading = self._resolve_flag(
            self.cpu_ram_efficient_loading, "CPU_RAM_EFFICIENT_LOADING"
        )
        if given_loading:  # 🤗 Transformers' from_pretrained reads it (meta weights off rank 0)
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(self.cpu_ram_efficient_loading)
        self.set_state_dict_type()
        self._set_wrap_policy()
        if self.ignored_modules is None:
            self.ignored_modules = _env("IGNORED_MODULES")
        if isinstance(self.mixed_precision_policy, dict) and (
            self.mixed_precision_policy.get("buffer_dtype") is not None
        ):
            self.notes.append(
                (
                    "mixed_precision_policy['buffer_dtype']",
                    "no effect, FSDP2's mixed precision leaves buffers in their own dtype",
                )
            )
        if self.mixed_precision_policy is not None:
            self.mixed_precision_policy = _mixed_precision(self.mixed_precision_policy)
        for name, why in FSDP1_WHY.items():
            if getattr(self, name) not in (None, False):
                self.notes.append((name, f"no effect under FSDP2, {why}"))

    # --- parsing ---------------------------------------------------------------------------

    @staticmethod
    def _resolve_flag(value: Any, variable: str, keep_objects: bool = False) -> Any:
        if value is None:
            value = _env(variable) or False
        if keep_objects and not isinstance(value, (bool, str, int)):
            return value  # a CPUOffloadPolicy
        return parse_flag(value, variable.lower())

    def _set_resharding(self) -> None:
        value = self.reshard_after_forward
        if value is None and self.sharding_strategy is not None:
            value = self.sharding_strategy
            self.notes.append(
                ("sharding_strategy", "FSDP1's name; FSDP2's is reshard_after_forward")
            )
        if value is None:
            value = _env("RESHARD_AFTER_FORWARD") or _env("SHARDING_STRATEGY") or True
        if isinstance(value, bool):
            self.reshard_after_forward = value
            return
        name = getattr(value, "name", str(value)).upper()
        if name.isdigit() and 1 <= int(name) <= len(_STRATEGIES):
            name = _STRATEGIES[int(name) - 1]
        if name in ("FULL_SHARD", "SHARD_GRAD_OP"):
            self.reshard_after_forward = name == "FULL_SHARD"
        elif name in _STRATEGIES:
            raise ValueError(
                f"sharding strategy {name} is not available with FSDP2 here: use FULL_SHARD "
                "(reshard_after_forward=True) or SHARD_GRAD_OP (reshard_after_forward=False)"
            )
        else:
            self.reshard_after_forward = parse_flag(value, "reshard_after_forward")

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Choose what ``save_state`` writes: ``"FULL_STATE_DICT"`` or ``"SHARDED_STATE_DICT"``
        (also accepts torch's ``StateDictType``); ``None`` keeps the current choice or reads
        ``FSDP_STATE_DICT_TYPE``."""
        from torch.distributed.fsdp import StateDictType

        value = state_dict_type if state_dict_type is not None else self.state_dict_type
        if value is None:
            value = _env("STATE_DICT_TYPE") or "SHARDED_STATE_DICT"
        if isinstance(value, StateDictType):
            value = value.name
        name = str(value).upper()
        if name.isdigit():
            name = StateDictType(int(name)).name
        if name not in STATE_DICT_TYPES:
            raise ValueError(
                f"state_dict_type={value!r} is not supported with FSDP2: use "
                + " or ".join(repr(t) for t in STATE_DICT_TYPES)
            )
        self.state_dict_type = StateDictType[name]

    def _set_wrap_policy(self) -> None:
        policy = self.auto_wrap_policy
        if policy is None:
            policy = _env("AUTO_WRAP_POLICY")
        if isinstance(policy, str):
            policy = policy.lower()
            if policy not in WRAP_POLICIES:
                raise ValueError(
                    f"auto_wrap_policy={policy!r}: use one of {', '.join(WRAP_POLICIES)}, or a "
                    "function policy(module) -> bool"
                )
        elif policy is not None and not callable(policy):
            raise TypeError(f"auto_wrap_policy must be a name or a function, not {policy!r}")
        self.auto_wrap_policy = policy
        names = self.transformer_cls_names_to_wrap
        if names is None:
            names = _env("TRANSFORMER_CLS_TO_WRAP")
        if isinstance(names, str):
            names = [name.strip() for name in names.split(",") if name.strip()]
        self.transformer_cls_names_to_wrap = list(names) if names is not None else None
        if self.min_num_params is None and _env("MIN_NUM_PARAMS") is not None:
            self.min_num_params = int(_env("MIN_NUM_PARAMS") or 0)
        if self.min_num_params is not None and not isinstance(self.min_num_params, int):
            raise ValueError(f"min_num_params must be an integer, not {self.min_num_params!r}")
        if policy == "size_based_wrap" and self.min_num_params is None:
            self.min_num_params = 100_000_000

    def set_mixed_precision(
        self, mixed_precision: str | torch.dtype, override: bool = False
    ) -> None:
        """Derive ``mixed_precision_policy`` from the Accelerator's ``mixed_precision`` (kept
        when one was given, unless ``override``): bf16/fp16 parameters, fp32 reductions."""
        if self.mixed_precision_policy is not None and not override:
            return
        dtype = _dtype(mixed_precision, "mixed_precision") if mixed_precision != "no" else None
        if dtype is None or dtype == torch.float32:
            self.mixed_precision_policy = None
            return
        self.mixed_precision_policy = _mixed_precision(
            {"param_dtype": dtype, "reduce_dtype": torch.float32}
        )

    @property
    def offloads_to_cpu(self) -> bool:
        """True when ``cpu_offload`` asks for the shards in CPU memory: ``True``, a
        ``CPUOffloadPolicy``, or FSDP1's ``CPUOffload(offload_params=True)``."""
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        offload = getattr(self.cpu_offload, "offload_params", self.cpu_offload)
        if isinstance(offload, OffloadPolicy):
            return isinstance(offload, CPUOffloadPolicy)
        return bool(offload)

    def take_notes(self) -> list[tuple[str, str]]:
        """What parsing has to say, as ``(option, text)`` pairs (FSDP1 options given, and the
        like), once: a second call gives only what was noted since."""
        notes, self.notes = list(self.notes), []
        return notes

    def __repr__(self) -> str:
        shown = ("reshard_after_forward", "auto_wrap_policy", "state_dict_type", "cpu_offload")
        return (
            "FullyShardedDataParallelPlugin("
            + ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
            + ")"
        )


def _mixed_precision(policy: Any) -> Any:
    """A ``MixedPrecisionPolicy`` from one, a dict of dtypes or one dtype name."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(policy, MixedPrecisionPolicy):
        return policy
    if isinstance(policy, (str, torch.dtype)):
        dtype = _dtype(policy, "mixed_precision_policy")
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    if isinstance(policy, dict):
        known = {"param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"}
        unknown = sorted(set(policy) - known - {"buffer_dtype"})
        if unknown:
            raise ValueError(f"mixed_precision_policy: unknown keys {unknown}; use {sorted(known)}")
        dtypes = known - {"cast_forward_inputs"}
        options: dict[str, Any] = {k: _dtype(v, k) for k, v in policy.items() if k in dtypes}
        if "cast_forward_inputs" in policy:
            options["cast_forward_inputs"] = bool(policy["cast_forward_inputs"])
        return MixedPrecisionPolicy(**options)
    raise TypeError(
        "mixed_precision_policy must be a MixedPrecisionPolicy, a dict of dtypes or a dtype name, "
        f"not {type(policy).__name__}"
    )


def enable_fsdp_ram_efficient_loading() -> None:
    """Turn on ``cpu_ram_efficient_loading`` through the environment, as Accelerate does: 🤗
    Transformers' ``from_pretrained`` then loads real weights on the main process only, and a
    plugin made without the option takes it; turns FSDP on (``ACCELERATE_USE_FSDP``) unless the
    variable is set already."""
    os.environ.setdefault("ACCELERATE_USE_FSDP", "True")
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Turn ``cpu_ram_efficient_loading`` off through the environment (every process loads
    real weights)."""
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"
