"""A machine whose host name resolves nowhere (many containers and CI runners) still launches:
a one-node launch keeps every socket on the loopback interface and never looks the name up.
So does the tests' reference ``torchrun`` (:mod:`loopback_torchrun`), which ``--standalone``
would not: its workers retry resolving the host name until the launch fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from loopback_torchrun import torchrun_command, torchrun_env
from machines import require

#: A host name no resolver knows (``.invalid`` is reserved for that, RFC 2606).
NAMELESS = "nowhere.invalid"
#: The variables that choose the backends' interfaces: the launch must choose without them.
SOCKET_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

LAUNCH = textwrap.dedent(
    """
    import socket
    import torch.distributed as dist
    from nb_accel import notebook_launcher

    def total():
        tensor = __import__("torch").ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(tensor)
        return socket.gethostname(), int(tensor.item())

    if __name__ == "__main__":
        print(notebook_launcher(total, num_processes=2), flush=True)
    """
)

REFERENCE = textwrap.dedent(
    """
    import socket
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    print(f"rank {dist.get_rank()} on {socket.gethostname()}: {int(tensor.item())}", flush=True)
    dist.destroy_process_group()
    """
)


def _on_nameless_host(
    command: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``command`` run with ``env`` in a UTS namespace of its own whose host name is
    :data:`NAMELESS`."""
    require([], [])
    quoted = " ".join(f"'{part}'" for part in command)
    return subprocess.run(
        ["unshare", "--uts", "sh", "-c", f"hostname {NAMELESS} && exec {quoted}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


@pytest.mark.timeout(120)
def test_a_launch_on_a_host_whose_name_does_not_resolve(tmp_path: Path) -> None:
    script = tmp_path / "launch.py"
    script.write_text(LAUNCH)
    env = {k: v for k, v in os.environ.items() if k not in SOCKET_VARIABLES}
    done = _on_nameless_host([sys.executable, str(script)], tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"[('{NAMELESS}', 3), ('{NAMELESS}', 3)]" in done.stdout


@pytest.mark.timeout(120)
def test_the_reference_torchrun_on_a_host_whose_name_does_not_resolve(tmp_path: Path) -> None:
    script = tmp_path / "reference.py"
    script.write_text(REFERENCE)
    done = _on_nameless_host(torchrun_command([str(script)]), tmp_path, torchrun_env())
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank} on {NAMELESS}: 3" in done.stdout
