"""The saved default configuration: one frozen dataclass, validated in one place, kept as YAML.

Where it lives: ``$NB_ACCEL_CONFIG_FILE`` if set, else ``$XDG_CONFIG_HOME/nb_accel/
default_config.yaml`` (``~/.config/nb_accel/default_config.yaml`` without ``XDG_CONFIG_HOME``),
or a path given explicitly. A missing file means the built-in defaults; a malformed one is an
error naming the file and the bad key. Writes are atomic (a temporary file renamed over).
``notebook_launcher`` and ``%%distributed`` take their defaults from it; arguments given
explicitly win.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
from collections.abc import Collection
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from ._registry import Registry

__all__ = [
    "CHOICES",
    "MESH_SIZES",
    "SHARDING_ALIASES",
    "SHARDING_STRATEGIES",
    "Config",
    "ConfigError",
    "config_path",
    "config_problems",
    "load_config",
    "save_config",
]

#: Every sharding strategy, by name: the one registry the saved configuration, the launch and
#: the Accelerator go by (``runtime/sharding/registry.py`` reads it as ``STRATEGIES``). The
#: built-in ones are their classes as ``"module:Class"``, modules of ``nb_accel.runtime.sharding``
#: loaded on first use: a new strategy is its module and one line here, an
#: ``nb_accel.sharding_strategies`` entry point, or a ``register_sharding_strategy`` call.
SHARDING_STRATEGIES: Registry[Any] = Registry(
    "sharding strategy",
    plural="sharding strategies",
    built_in={
        "ddp": "nb_accel.runtime.sharding.ddp:DataParallelStrategy",
        "fsdp2": "nb_accel.runtime.sharding.fsdp2:FullyShardedStrategy",
    },
    group="nb_accel.sharding_strategies",
    load="nb_accel.runtime.sharding.registry:checked_strategy",
    in_workers=True,
)
#: Other names a strategy is known by (``"fsdp"``: what earlier releases saved, and Accelerate's
#: own word), read as the name they stand for wherever a strategy is named.
SHARDING_ALIASES: dict[str, str] = {"fsdp": "fsdp2"}

#: The sizes of the launches' device mesh (Accelerate's ``ParallelismConfig``), in the mesh's
#: order: the saved fields, ``notebook_launcher``'s ``parallelism_config`` keys, the form's rows.
MESH_SIZES = ("dp_replicate_size", "dp_shard_size", "cp_size", "tp_size")

#: Allowed values of the fields that take one of a few (the strategies: those registered too).
CHOICES: dict[str, Collection[Any]] = {
    "mixed_precision": ("no", "bf16", "fp16"),
    "sharding": SHARDING_STRATEGIES,
    "start_method": (None, "fork", "spawn", "forkserver"),
    "rdzv_backend": ("c10d",),
}


#: The longest timeout accepted (30 days; torch cannot represent much more).
MAX_TIMEOUT_S = 30 * 24 * 3600.0


class ConfigError(ValueError):
    """A configuration value, or a configuration file, that cannot be used."""


@dataclass(frozen=True)
class Config:
    """Defaults for launches (``notebook_launcher``, ``%%distributed``).

    Attributes:
        num_processes: ranks per node; ``None``: one per GPU, else 1.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"`` (on the CPU too, under CPU autocast
            with a CPU ``GradScaler``).
        sharding: ``"ddp"`` (each rank holds the whole model), ``"fsdp2"`` (parameters,
            gradients and optimizer state sharded across the ranks, with torch's fully_shard;
            ``"fsdp"`` is read as it), or the name of a strategy registered with
            ``register_sharding_strategy``.
        start_method: ``"fork"``, ``"spawn"``, ``"forkserver"``; ``None``: the platform's.
        gradient_accumulation_steps: what ``Accelerator()`` uses when not told otherwise.
        timeout: seconds a collective may wait for the other ranks.
        cpu: launch on the CPU even when GPUs are present.
        num_nodes: machines taking part (multi-node launches).
        node_rank: this machine's number, 0 to ``num_nodes - 1``.
        rdzv_endpoint: ``host:port`` of the rendezvous (multi-node).
        rdzv_backend: the rendezvous backend (``"c10d"``).
        rdzv_timeout: seconds to wait for every node to join.
        max_restarts: times the worker group is restarted after a failure, on one machine or
            several (torch's elastic agent restarts every rank; 0: never).
        hosts: machines a launch runs on, driven from this kernel: host names as ssh knows
            them, ``"slurm"`` for the nodes of the current SLURM allocation, or ``"ray"`` for
            the nodes of the Ray cluster the kernel is on (``num_nodes``: how many of them).
        ssh_config: an OpenSSH client configuration file for ``hosts`` (``None``: yours).
        reuse_workers: keep launches' workers warm for the next launches (the
            ``%%distributed`` pool's workers), instead of starting and stopping them each time.
        post_mortem_wait: seconds the rank that raised in a launch waits, paused, for
            ``%debug`` to inspect its frames (0: it ends at once, as the others do).
        dp_replicate_size: replicas of the model in the launch's device mesh (Accelerate's
            ParallelismConfig; 1 everywhere: no mesh, the sharding alone decides).
        dp_shard_size: FSDP2 shards within each replica (above 1: sharded with FSDP2).
        cp_size: ranks of a context parallel group (CUDA GPUs only).
        tp_size: ranks of a tensor parallel group (the model comes parallelised over them).
    """

    num_processes: int | None = None
    mixed_precision: str = "no"
    sharding: str = "ddp"
    start_method: str | None = None
    gradient_accumulation_steps: int = 1
    timeout: float = 1800.0
    cpu: bool = False
    num_nodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    rdzv_timeout: float = 900.0
    max_restarts: int = 0
    hosts: str | list[str] | None = None
    ssh_config: str | None = None
    reuse_workers: bool = False
    post_mortem_wait: float = 600.0
    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    cp_size: int = 1
    tp_size: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.sharding, str) and self.sharding in SHARDING_ALIASES:
            object.__setattr__(self, "sharding", SHARDING_ALIASES[self.sharding])
        problems = self.problems()
        if problems:
            raise ConfigError("; ".join(f"{name}: {text}" for name, text in problems.items()))

    def problems(self) -> dict[str, str]:
        """Every field whose value is not allowed, with what is allowed (empty when valid)."""
        found: dict[str, str] = {}

        def whole(name: str, value: Any, low: int, optional: bool = False) -> None:
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                found[name] = f"must be a whole number >= {low}, got {value!r}"

        whole("num_processes", self.num_processes, 1, optional=True)
        whole("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        whole("num_nodes", self.num_nodes, 1)
        whole("node_rank", self.node_rank, 0)
        whole("max_restarts", self.max_restarts, 0)
        for size in MESH_SIZES:
            whole(size, getattr(self, size), 1)
        for name in ("timeout", "rdzv_timeout"):
            value = getattr(self, name)
            number = not isinstance(value, bool) and isinstance(value, (int, float))
            if not number or not 0 < value <= MAX_TIMEOUT_S:
                found[name] = (
                    f"must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f} "
                    f"(30 days), got {value!r}"
                )
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                found[name] = (
                    f"must be one of {', '.join(map(repr, allowed))}, got {getattr(self, name)!r}"
                )
        wait = self.post_mortem_wait
        if (
            isinstance(wait, bool)
            or not isinstance(wait, (int, float))
            or not 0 <= wait <= MAX_TIMEOUT_S
        ):
            found["post_mortem_wait"] = (
                f"must be a number of seconds from 0 (do not wait) to {MAX_TIMEOUT_S:.0f}, "
                f"got {wait!r}"
            )
        for flag in ("cpu", "reuse_workers"):
            if not isinstance(getattr(self, flag), bool):
                found[flag] = f"must be true or false, got {getattr(self, flag)!r}"
        if (
            "node_rank" not in found
            and "num_nodes" not in found
            and self.node_rank >= self.num_nodes
        ):
            found["node_rank"] = f"must be below num_nodes ({self.num_nodes}), got {self.node_rank}"
        _mesh_problem(self, found)
        hosts_problem = _hosts_problem(self.hosts)
        if hosts_problem:
            found["hosts"] = hosts_problem
        elif self.hosts is not None and self.hosts != "ray" and self.num_nodes > 1:
            found["hosts"] = "leave num_nodes at 1 with hosts: there is one node per host"
        if self.ssh_config is not None and (
            not isinstance(self.ssh_config, str) or not self.ssh_config.strip()
        ):
            found["ssh_config"] = f"must be a file's path, got {self.ssh_config!r}"
        on_ray = self.hosts == "ray"  # num_nodes: how many of the cluster's nodes
        if self.num_nodes > 1 and not on_ray and not _is_endpoint(self.rdzv_endpoint):
            found["rdzv_endpoint"] = (
                f"must be 'host:port' when num_nodes > 1, got {self.rdzv_endpoint!r}"
            )
        return found

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (what the YAML file holds)."""
        return dataclasses.asdict(self)


def _mesh_problem(config: Config, found: dict[str, str]) -> None:
    """Add to ``found`` that the mesh's sizes do not multiply to the launches' ranks (when
    both are known: processes given, machines counted)."""
    if any(name in found for name in MESH_SIZES) or config.num_processes is None:
        return
    sizes = {name: getattr(config, name) for name in MESH_SIZES}
    used = [name for name, size in sizes.items() if size > 1]
    hosts = config.hosts
    if not used or hosts in ("slurm", "ray") or "num_processes" in found or "hosts" in found:
        return
    machines = len(hosts) if isinstance(hosts, (list, tuple)) else config.num_nodes
    ranks = config.num_processes * machines
    product = math.prod(sizes.values())
    if product != ranks:
        found[used[0]] = (
            f"the mesh's sizes multiply to {product}, and the launches have {ranks} ranks "
            f"({config.num_processes} per machine on {machines}): make the product {ranks}"
        )


def _hosts_problem(hosts: object) -> str:
    """What is wrong with ``hosts`` ("" when nothing)."""
    if hosts is None or hosts in ("slurm", "ray"):
        return ""
    if isinstance(hosts, str) or not isinstance(hosts, (list, tuple)) or not hosts:
        return f'must be a list of host names, "slurm" or "ray", got {hosts!r}'
    if not all(isinstance(name, str) and name.strip() for name in hosts):
        return f"must hold host names, got {list(hosts)!r}"
    repeated = sorted({name for name in hosts if list(hosts).count(name) > 1})
    return f"names {', '.join(repeated)} more than once" if repeated else ""


def _is_endpoint(value: object) -> bool:
    if not isinstance(value, str) or ":" not in value:
        return False
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The file a configuration is read from and saved to (see the module's notes)."""
    if path is not None:
        return Path(path).expanduser()
    explicit = os.environ.get("NB_ACCEL_CONFIG_FILE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join("~", ".config")
    return Path(base).expanduser() / "nb_accel" / "default_config.yaml"


_FIELDS = {f.name for f in fields(Config)}


def config_problems(**values: Any) -> dict[str, str]:
    """What is wrong with a configuration of ``values`` (defaults for the fields left out),
    field by field, without raising: for forms that show problems as they are typed."""
    unknown = sorted(set(values) - _FIELDS)
    if unknown:
        raise TypeError(f"unknown configuration field(s): {', '.join(unknown)}")
    draft = object.__new__(Config)
    for item in fields(Config):
        object.__setattr__(draft, item.name, values.get(item.name, item.default))
    return draft.problems()


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """The saved configuration; the built-in defaults when the file does not exist."""
    file = config_path(path)
    if not file.exists():
        return Config()
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read {file}: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a mapping of settings, not {type(data).__name__}")
    data = _normalised(data)
    unknown = sorted(str(key) for key in data if key not in _FIELDS)
    if unknown:
        keys = ", ".join(sorted(_FIELDS))
        raise ConfigError(f"{file}: unknown key(s) {', '.join(unknown)}; the keys are {keys}")
    try:
        return Config(**data)
    except ConfigError as error:
        raise ConfigError(f"{file}: {error}") from None


def _normalised(data: dict[Any, Any]) -> dict[Any, Any]:
    """Undo the surprises of hand-written files: YAML 1.1's unquoted ``no`` read as false and
    ``1e3`` (no dot) read as a string, and ``sharding`` written in capitals (``FSDP2``) or by
    another name (``fsdp``, what earlier releases saved)."""
    fixed = dict(data)
    if fixed.get("mixed_precision") is False:
        fixed["mixed_precision"] = "no"
    if isinstance(fixed.get("sharding"), str):
        name = fixed["sharding"].lower()  # "FSDP2" as the form shows it
        fixed["sharding"] = SHARDING_ALIASES.get(name, name)
    for name in ("timeout", "rdzv_timeout"):
        value = fixed.get(name)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                fixed[name] = float(value)
    return fixed


def save_config(config: Config, path: str | os.PathLike[str] | None = None) -> Path:
    """Write ``config`` (atomically) and return where it went."""
    file = config_path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    text = "# nb_accel defaults (notebook_launcher, %%distributed)\n" + yaml.safe_dump(
        config.to_dict(), sort_keys=False
    )
    handle, temporary = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return file


def write_basic_config(
    mixed_precision: str = "no",
    save_location: str | os.PathLike[str] | None = None,
    use_xpu: bool = False,
) -> Path | bool:
    """Accelerate's one-line setup: save a configuration with ``mixed_precision`` as the
    launcher's default, unless one is already saved (then nothing is written and ``False`` is
    returned, as Accelerate does). Returns the file written. ``use_xpu`` is accepted for
    compatibility (nb_accel does not launch on Intel GPUs)."""
    del use_xpu
    file = config_path(save_location)
    if file.exists():
        print(f"Configuration already exists at {file}, will not override.")
        return False
    return save_config(Config(mixed_precision=str(mixed_precision).lower()), file)
