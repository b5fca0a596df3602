"""The flags of the ``%distributed`` magics: those that say what the pool's workers are (the
options of ``notebook_launcher`` by other names, declared once for the cell and the line
magic), turned into launch options, and written back as the user would type them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, parse_argstring

from .._keywords import closest
from ..launch.request import request_fields

__all__ = [
    "flag_text",
    "hosts_option",
    "mesh_option",
    "parse_flags",
    "pool_flags",
    "pool_options",
    "ranks_option",
]

_Magic = Callable[..., Any]


def ranks_option(text: str | None) -> list[int] | None:
    """``--ranks``' value: the rank numbers (``None``: not given)."""
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--ranks takes rank numbers separated by commas, got {text!r}") from None


#: The help of ``--hosts``.
_HOSTS_HELP = (
    "spread the pool over these machines, -n ranks on each: host names separated by commas, "
    "slurm for the nodes of this SLURM allocation, ray for the nodes of the Ray cluster, or "
    "local for this machine only (default: "
    "the saved hosts, if any)"
)
#: The help of ``--ssh-config``.
_SSH_CONFIG_HELP = "an OpenSSH client configuration file for --hosts (default: your own)"


def hosts_option(text: str | None) -> str | list[str] | None:
    """``--hosts``' value as ``WorkerPool`` takes it."""
    if text is None:
        return None
    if text.strip() in ("slurm", "ray", "local"):
        return text.strip()
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UsageError("--hosts takes host names separated by commas, slurm or ray")
    return names


#: The help of ``--mesh``.
_MESH_HELP = (
    "lay the ranks out on a device mesh for Accelerator() in the cells: sizes by dimension, "
    "e.g. tp=2,dp_shard=2 (dp_replicate, dp_shard, tp, cp; their product is the ranks)"
)


def mesh_option(text: str) -> dict[str, int]:
    """``--mesh``' value (``tp=2,dp_shard=2``) as ``parallelism_config`` sizes."""
    sizes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, _, size = part.partition("=")
        name = name.strip().removesuffix("_size")
        if not part or not size.strip().isdigit() or not name:
            raise UsageError(f"--mesh takes sizes by dimension, e.g. tp=2,dp_shard=2; got {text!r}")
        sizes[f"{name}_size"] = int(size)
    return sizes


#: The flags that say what the pool's workers are: they take effect when the pool starts, and
#: a cell or command that gives one the running pool differs in is refused (say restart).
_POOL_FLAGS = (
    argument("-n", "--num-processes", type=int, help="number of ranks"),
    argument("--start-method", help="fork, spawn or forkserver"),
    argument("--mixed-precision", help="no, bf16 or fp16"),
    argument(
        "--cpu",
        action="store_const",
        const=True,
        help="use the CPU even when GPUs are present",
    ),
    argument(
        "--fsdp",
        action=argparse.BooleanOptionalAction,
        help="shard the model across the ranks with FSDP2 (--sharding fsdp2); --no-fsdp: DDP "
        "(default: as saved)",
    ),
    argument(
        "--sharding",
        help="the sharding strategy by name: ddp, fsdp2, or one registered (default: as saved)",
    ),
    argument("--hosts", help=_HOSTS_HELP),
    argument("--ssh-config", help=_SSH_CONFIG_HELP),
    argument("--mesh", dest="parallelism_config", type=mesh_option, help=_MESH_HELP),
)


def pool_flags(magic: _Magic) -> _Magic:
    """``magic`` taking every flag of :data:`_POOL_FLAGS`."""
    for flag in reversed(_POOL_FLAGS):
        magic = flag(magic)
    return magic


def pool_options(args: argparse.Namespace) -> dict[str, Any]:
    """The launch options the flags gave (those not given left out), by their names in
    ``notebook_launcher``."""
    given = {
        name: getattr(args, name)
        for name in request_fields()
        if getattr(args, name, None) is not None
    }
    if "hosts" in given:
        given["hosts"] = hosts_option(given["hosts"])
    return given


def flag_text(parser: argparse.ArgumentParser, name: str, value: Any) -> str:
    """How option ``name`` with ``value`` is written on the magic's line: ``-n 3``,
    ``--no-fsdp``, ``--cpu``."""
    for action in parser._actions:
        if action.dest != name:
            continue
        flags = action.option_strings
        if isinstance(action, argparse.BooleanOptionalAction):
            return flags[0] if value else flags[-1]
        if action.nargs == 0:
            return flags[-1]
        written = ",".join(value) if isinstance(value, list) else value
        if isinstance(value, dict):  # --mesh's sizes
            written = ",".join(f"{n.removesuffix('_size')}={s}" for n, s in value.items())
        return f"{flags[0]} {written}"
    return name


#: How argparse starts the message for flags no magic declares.
_UNRECOGNISED = "unrecognized arguments: "


def parse_flags(magic: _Magic, line: str) -> argparse.Namespace:
    """``line``'s flags as ``magic`` declares them; a flag it does not declare is refused
    naming the flag it most likely misspells (``--num-proceses``: ``--num-processes``)."""
    try:
        return parse_argstring(magic, line)
    except UsageError as error:
        message = str(error)
        if not message.startswith(_UNRECOGNISED):
            raise
        parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
        flags = [flag for action in parser._actions for flag in action.option_strings]
        given = message[len(_UNRECOGNISED) :].split()
        hints = []
        for word in given:
            flag = word.split("=", 1)[0]
            meant = closest(flag, flags) if flag.startswith("-") else None
            if meant:
                hints.append(f"{flag}: did you mean {meant}?")
        if not hints:
            raise
        raise UsageError(f"{message} ({'; '.join(hints)})") from None
