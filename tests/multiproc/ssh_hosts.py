"""Machines reachable over SSH, for tests: network namespaces joined by a bridge, each running
a real OpenSSH server (Debian's ``openssh-server``) on its own address, a key made for the run,
and an ``ssh_config`` that names them ``node0``, ``node1``, ...

Needs root, ``ip`` and ``sshd``; the tests say why they skip where these are missing (in CI
they are there: ``make test`` installs ``openssh-server``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

SUBNET = "192.168.214"
#: The kernel's address on the bridge (the machines' gateway).
KERNEL_ADDRESS = f"{SUBNET}.254"
SSHD = "/usr/sbin/sshd"


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def require_ssh_machines() -> None:
    """Skip, saying why, where the machines cannot be made; in CI (``CI`` set), where
    ``make test`` prepares them, fail instead."""
    missing = [tool for tool in ("ip", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    if not os.path.exists(SSHD):
        missing.append("sshd (openssh-server)")
    if not os.path.isdir("/run/sshd"):
        missing.append("/run/sshd")
    reason = ""
    if missing:
        reason = f"needs {', '.join(missing)} for SSH hosts (`make test` installs them as root)"
    elif os.geteuid() != 0:
        reason = "needs root to create network namespaces (ip netns add)"
    if reason and os.environ.get("CI"):
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)


@dataclass
class Host:
    """One machine: its name in the ``ssh_config``, namespace and address."""

    name: str
    namespace: str
    address: str


class SshMachines:
    """``count`` machines; everything made for them is removed at teardown."""

    def __init__(
        self, tmp_path: Path, cleanup: Callable[[Callable[[], None]], None], count: int = 2
    ) -> None:
        tag = secrets.token_hex(3)
        self.folder = tmp_path / "ssh"
        self.folder.mkdir()
        self._servers: list[subprocess.Popen[bytes]] = []
        cleanup(self._stop_servers)  # runs last: after the namespaces are gone it has no work
        self.hosts = [
            Host(f"node{i}", f"nbssh-{tag}-{i}", f"{SUBNET}.{i + 1}") for i in range(count)
        ]
        bridge = f"nbbr{tag}"
        self._ip("link", "add", bridge, "type", "bridge")
        cleanup(lambda: _run("ip", "link", "del", bridge))
        self._ip("addr", "add", f"{KERNEL_ADDRESS}/24", "dev", bridge)
        self._ip("link", "set", bridge, "up")
        for index, host in enumerate(self.hosts):
            self._ip("netns", "add", host.namespace)
            cleanup(lambda name=host.namespace: _run("ip", "netns", "del", name))
            outside, inside = f"nbv{tag}{index}", f"nbw{tag}{index}"
            self._ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            cleanup(lambda link=outside: _run("ip", "link", "del", link))
            self._ip("link", "set", outside, "master", bridge)
            self._ip("link", "set", outside, "up")
            self._ip("link", "set", inside, "netns", host.namespace)
            self._ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
            self._ip("-n", host.namespace, "link", "set", inside, "up")
            self._ip("-n", host.namespace, "link", "set", "lo", "up")
            self._ip("-n", host.namespace, "route", "add", "default", "via", KERNEL_ADDRESS)
        self.key = self.folder / "key"
        for key in (self.key, self.folder / "host_key"):
            _check(_run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)))
        (self.folder / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        self.ssh_config = self.folder / "ssh_config"
        self.ssh_config.write_text("".join(self._client_entry(host) for host in self.hosts))
        for host in self.hosts:
            self._serve(host)

    @staticmethod
    def _ip(*arguments: str) -> None:
        done = _run("ip", *arguments)
        if done.returncode != 0:
            if arguments[:2] in (("netns", "add"), ("link", "add")):
                pytest.skip(f"cannot make the machines: ip {' '.join(arguments)}: {done.stderr}")
            raise RuntimeError(f"ip {' '.join(arguments)}: {done.stderr.strip()}")

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
        server = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, SSHD, "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._servers.append(server)
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

    def _stop_servers(self) -> None:
        """End the servers and whatever still runs on the machines (a test's assertion on
        what is left behind looks before this)."""
        for server in self._servers:
            server.kill()
            server.communicate()
        for host in self.hosts:
            for pid in _run("ip", "netns", "pids", host.namespace).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)

    def processes(self) -> list[str]:
        """The command lines of the processes running on the machines now, sshd's but not."""
        found = []
        for host in self.hosts:
            for pid in _run("ip", "netns", "pids", host.namespace).stdout.split():
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                text = command.decode(errors="replace").strip()
                if not text.startswith(SSHD) and "sshd:" not in text:
                    found.append(f"{host.name}: {text}")
        return found


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"{done.args}: {done.stderr.strip()}")
