"""A real SLURM cluster on one machine, for tests: Debian's ``slurm-wlm`` and ``munge``.

``munged`` and ``slurmctld`` run in the root namespace (the kernel's side of the bridge), one
``slurmd -N snK`` on each machine (its network namespace, its own ``/dev/shm`` and temporary
folder) with its ``NodeAddr``; every daemon reads the same absolute ``SLURM_CONF`` and its
files live in the test's folder. Node names are ``sn0``, ``sn1``, ...; it comes up in about a
second. At teardown every job is cancelled and every step ends before the daemons stop.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from machines import BridgedMachines, require
from ports import free_port


def require_slurm_cluster() -> None:
    """Skip (in CI: fail), saying why, where the cluster cannot be made."""
    require(["munged", "slurmctld", "slurmd", "salloc", "srun", "scancel", "scontrol", "sinfo"], [])


class SlurmCluster(BridgedMachines):
    """``count`` SLURM nodes; everything made for them is removed at teardown."""

    daemons = ("slurmd", "slurmstepd", "slurmctld", "munged")

    def __init__(
        self, tmp_path: Path, cleanup: Callable[[Callable[[], None]], None], count: int = 2
    ) -> None:
        super().__init__(tmp_path, cleanup, count, prefix="sn")
        folder = self.folder
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        socket_path = folder / "munge.socket"
        self.daemon(
            [
                *("munged", "--foreground", "--force", f"--key-file={key}"),
                f"--socket={socket_path}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--log-file={folder / 'munged.log'}",
                f"--seed-file={folder / 'munged.seed'}",
            ]
        )
        (folder / "state").mkdir()
        self.conf = folder / "slurm.conf"
        nodes = "".join(
            f"NodeName={host.name} NodeAddr={host.address} CPUs=2 State=UNKNOWN\n"
            for host in self.hosts
        )
        self.conf.write_text(
            "ClusterName=nbaccel\n"
            f"SlurmctldHost={socket.gethostname()}({self.kernel_address})\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nAuthInfo=socket={socket_path}\nCredType=cred/munge\n"
            f"StateSaveLocation={folder / 'state'}\n"
            f"SlurmdSpoolDir={folder}/spool-%n\n"
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}\n"
            f"SlurmdPidFile={folder}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={folder / 'slurmctld.log'}\n"
            f"SlurmdLogFile={folder}/slurmd-%n.log\n"
            f"SlurmctldPort={free_port('')}\nSlurmdPort=6818\n"  # slurmd: one per namespace
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nReturnToService=2\nMpiDefault=none\n"
            f"{nodes}"
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
        (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._wait_for(socket_path.exists, "munged did not make its socket")
        self.daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env)
        for host in self.hosts:
            command = ["slurmd", "-D", "-N", host.name, "-f", str(self.conf)]
            self.daemon(self.on(host, command), env=self.env)
        self._wait_for(self._all_idle, "the nodes did not come up")

    def _end_work(self) -> None:
        """Cancel every job still running: its steps end, and report their end to
        ``slurmctld``, while the daemons and the network are up (a step whose controller has
        gone retries for ever)."""
        subprocess.run(
            ["scancel", "--user", "root"],
            env=self.env,
            capture_output=True,
            timeout=30,
            check=False,
        )

    def _all_idle(self) -> bool:
        shown = subprocess.run(
            ["sinfo", "--noheader", "--format=%n %t"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        return shown.count("idle") == len(self.hosts)

    def _wait_for(self, ready: Callable[[], bool], failure: str) -> None:
        deadline = time.monotonic() + 60
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{failure} within 60 s; see {self.folder}")
            time.sleep(0.1)  # polling the daemons' state, not ordering events

    def allocation(self) -> dict[str, str]:
        """Allocate every node (``salloc --no-shell``, released at teardown): the variables a
        kernel started inside the allocation has (its job and nodes, and the cluster's
        configuration), for a process started outside it."""
        done = subprocess.run(
            ["salloc", f"--nodes={len(self.hosts)}", "--no-shell"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        granted = re.search(r"Granted job allocation (\d+)", done.stderr)
        if granted is None:
            raise RuntimeError(f"salloc --no-shell: {done.stderr.strip()}")
        job = granted.group(1)
        return {
            "SLURM_CONF": str(self.conf),
            "SLURM_JOB_ID": job,
            "SLURM_JOBID": job,
            "SLURM_JOB_NODELIST": ",".join(host.name for host in self.hosts),
            "SLURM_NNODES": str(len(self.hosts)),
        }

    def in_allocation(
        self, script: Path, *args: str, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python script args`` as a kernel inside ``salloc -N <all nodes>``."""
        command = ["salloc", f"--nodes={len(self.hosts)}", sys.executable, str(script), *args]
        return subprocess.run(
            command, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def start_in_allocation(
        self, script: Path, *args: str, capture: bool = False
    ) -> subprocess.Popen[str]:
        """Start ``python script args`` inside ``salloc``; the caller waits for it (and reads
        its output, with ``capture``)."""
        command = ["salloc", f"--nodes={len(self.hosts)}", sys.executable, str(script), *args]
        pipe = subprocess.PIPE if capture else None
        return subprocess.Popen(command, env=self.env, text=True, stdout=pipe, stderr=pipe)
