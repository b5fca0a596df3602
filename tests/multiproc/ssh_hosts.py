"""Machines reachable over SSH, for tests: :class:`~machines.BridgedMachines`, each running a
real OpenSSH server (Debian's ``openssh-server``) on its own address, a key made for the run,
and an ``ssh_config`` that names them ``node0``, ``node1``, ...
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from machines import BridgedMachines, Host, require, run

SSHD = "/usr/sbin/sshd"


def require_ssh_machines() -> None:
    """Skip (in CI: fail), saying why, where the SSH hosts cannot be made."""
    require(["ssh", "ssh-keygen"], [SSHD, "/run/sshd"])


class SshMachines(BridgedMachines):
    """``count`` SSH hosts; everything made for them is removed at teardown."""

    daemons = (SSHD, "sshd:")

    def __init__(
        self, tmp_path: Path, cleanup: Callable[[Callable[[], None]], None], count: int = 2
    ) -> None:
        super().__init__(tmp_path, cleanup, count)
        self.key = self.folder / "key"
        for key in (self.key, self.folder / "host_key"):
            _check(run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)))
        (self.folder / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        self.ssh_config = self.folder / "ssh_config"
        self.ssh_config.write_text("".join(self._client_entry(host) for host in self.hosts))
        for host in self.hosts:
            self._serve(host)

    def _client_entry(self, host: Host) -> str:
        return (
            f"Host {host.name}\n"
            f"  HostName {host.address}\n"
            "  User root\n"
            f"  IdentityFile {self.key}\n"
            "  IdentitiesOnly yes\n"
            "  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n"
        )

    def _serve(self, host: Host) -> None:
        """Start ``sshd`` in ``host``'s namespace and wait until it accepts connections."""
        config = self.folder / f"sshd_config_{host.name}"
        config.write_text(
            f"ListenAddress {host.address}\n"
            "Port 22\n"
            f"HostKey {self.folder / 'host_key'}\n"
            f"AuthorizedKeysFile {self.folder / 'authorized_keys'}\n"
            f"PidFile {self.folder / f'sshd_{host.name}.pid'}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "StrictModes no\n"
            "UsePAM no\n"
        )
        server = self.daemon(self.on(host, [SSHD, "-D", "-e", "-f", str(config)]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if server.poll() is not None:
                error = server.stderr.read().decode() if server.stderr else ""
                raise RuntimeError(f"sshd on {host.name} ended: {error}")
            try:
                socket.create_connection((host.address, 22), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)  # polling a socket, not ordering events
        raise RuntimeError(f"sshd on {host.name} did not listen within 30 s")


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"{done.args}: {done.stderr.strip()}")
