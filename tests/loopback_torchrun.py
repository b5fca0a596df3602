"""``torchrun`` (``torch.distributed.run``) as the tests launch it for a reference run: one node,
every socket on the loopback interface.

``--standalone`` names the rendezvous store by this machine's host name, which each worker then
resolves; on a machine whose host name does not resolve (many CI containers) the workers retry
that lookup until the launch fails. Here the store listens on ``127.0.0.1`` (a free port), the
workers reach it there, and gloo opens its sockets on ``lo``: nothing depends on the host name.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Mapping, Sequence


def torchrun_command(script_and_args: Sequence[str], nproc: int = 2) -> list[str]:
    """The command that runs ``script_and_args`` on ``nproc`` processes of one node."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        f"--rdzv-id={uuid.uuid4().hex}",
        "--local-addr=127.0.0.1",
        *script_and_args,
    ]


def torchrun_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (this process's environment by default) with gloo's sockets on ``lo``."""
    env = dict(os.environ if base is None else base)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env
