"""What each test machine has of its own, as a real machine does: a memory file system
(``/dev/shm``) and a temporary folder that neither the kernel nor another machine sees.

A command started through :func:`on_machine` runs in the machine's network namespace and in a
mount namespace of its own (``unshare --mount``) where fresh ``tmpfs`` file systems hide those
folders. What every machine of a cluster reaches, as it would on a network file system, stays
reachable at the same path: the folders the caller names (the test's own) and, where they lie
inside a hidden folder, the interpreter, the project and the current folder.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import nb_accel

__all__ = ["OWN_FOLDERS", "on_machine", "own_folders_command"]

#: The folders each machine has of its own (fresh and empty on each).
OWN_FOLDERS = tuple(sorted({"/dev/shm", "/tmp", tempfile.gettempdir()}))


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _reached(shared: Sequence[Path]) -> list[Path]:
    """The folders inside :data:`OWN_FOLDERS` that the machine must still reach, none inside
    another."""
    project = Path(nb_accel.__file__).resolve().parents[1]
    candidates = [*shared, Path(sys.prefix), Path(sys.base_prefix), project, Path.cwd()]
    own = [Path(folder) for folder in OWN_FOLDERS]
    inside = {
        path.resolve()
        for path in candidates
        if any(_inside(path.resolve(), folder) for folder in own)
    }
    return sorted(p for p in inside if not any(q != p and _inside(p, q) for q in inside))


def on_machine(namespace: str, shared: Sequence[Path], command: Sequence[str]) -> list[str]:
    """``command`` run on the machine of network namespace ``namespace``, with its own
    :data:`OWN_FOLDERS`, ``shared`` (and what the interpreter needs) still reached.

    The shared folders are opened before the fresh file systems hide them, then mounted back
    from those descriptors; the command replaces the shell (its pid is the one started).
    """
    return [
        *("ip", "netns", "exec", namespace),
        *("unshare", "--mount", "--propagation", "private", "--"),
        *own_folders_command(shared, command),
    ]


def own_folders_command(shared: Sequence[Path], command: Sequence[str]) -> list[str]:
    """``command`` run with fresh :data:`OWN_FOLDERS` (in a mount namespace the caller made),
    ``shared`` and what the interpreter needs mounted back in."""
    kept = list(enumerate(map(str, _reached(shared)), start=3))  # descriptor, folder
    steps = [f"exec {fd}<{shlex.quote(folder)}" for fd, folder in kept]
    for own in map(shlex.quote, OWN_FOLDERS):
        steps.append(f"mkdir -p {own}")
        steps.append(f"mount -t tmpfs -o mode=1777 nb-machine {own}")
    for fd, folder in kept:
        steps.append(f"mkdir -p {shlex.quote(folder)}")
        steps.append(f"mount --no-canonicalize --bind /proc/self/fd/{fd} {shlex.quote(folder)}")
        steps.append(f"exec {fd}<&-")
    steps.append('exec "$@"')
    return ["sh", "-c", " && ".join(steps), "sh", *command]
