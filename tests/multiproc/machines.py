"""Machines for tests: network namespaces joined by a bridge (the kernel's address on it is the
machines' gateway), each with its own ``/dev/shm`` and temporary folder (:mod:`own_folders`);
every process on them is found by its network namespace, also once it has left the test's
process tree (a SLURM step, an SSH session), and ended at teardown. The SSH hosts
(:mod:`ssh_hosts`) and the SLURM cluster (:mod:`slurm_cluster`) are made of them.

Needs root, ``ip`` and ``unshare``; the tests say why they skip where these are missing (in CI,
where ``make test`` installs what they need, they fail instead: :func:`unavailable`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import system_features
from own_folders import on_machine

#: The machines' networks are ``10.213.N.0/24``, N chosen free per instance (runs side by side
#: on one machine must not share addresses).
NETWORK_PREFIX = "10.213"


@contextlib.contextmanager
def _choosing_a_subnet() -> Iterator[None]:
    """Inside the block, no other test process chooses a network (runs side by side, as the
    chaos campaign's shards: each checks the networks in use, then takes one). The lock is
    this module's own file's: nothing is made for it."""
    with open(__file__, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _free_subnet() -> str:
    used = run("ip", "-4", "addr").stdout
    for _ in range(100):
        subnet = f"{NETWORK_PREFIX}.{secrets.randbelow(254) + 1}"
        if f"{subnet}." not in used:
            return subnet
    raise RuntimeError(f"no free {NETWORK_PREFIX}.N.0/24 network for the test machines")


def run(*command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (30 s at most); its result, whatever its exit code."""
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def unavailable(reason: str) -> None:
    """Skip the test, saying ``reason``: the machines cannot be made here; in CI (``CI`` set),
    where they must be, fail instead (the rule of :mod:`system_features`). Every test that
    needs machines skips through this."""
    system_features.unavailable(reason)


def require(tools: list[str], files: list[str]) -> None:
    """Skip (in CI: fail), saying why, where ``tools`` (on PATH) or ``files`` are missing or
    this is not root."""
    missing = [tool for tool in ["ip", "unshare", *tools] if shutil.which(tool) is None]
    missing += [path for path in files if not os.path.exists(path)]
    if missing:
        unavailable(f"needs {', '.join(missing)} (`make test` installs them as root)")
    elif os.geteuid() != 0:
        unavailable("needs root to create network namespaces (ip netns add)")


def ip(*arguments: str) -> None:
    """Run ``ip arguments``; where a namespace or a link cannot be made at all, skip (in CI:
    fail) saying why; any other failure raises."""
    done = run("ip", *arguments)
    if done.returncode != 0:
        said = f"ip {' '.join(arguments)}: {done.stderr.strip()}"
        if arguments[:2] in (("netns", "add"), ("link", "add")):
            unavailable(f"cannot make the machines: {said}")
        raise RuntimeError(said)


#: Where ``ip netns exec`` finds files that it puts in place of ``/etc``'s for a namespace.
NETNS_ETC = Path("/etc/netns")


def _resolve_nothing(namespace: str, cleanup: Callable[[Callable[[], None]], None]) -> None:
    """Have name lookups in ``namespace`` fail at once: the machine's name server is out of
    the machines' reach, and each lookup (torch's store looks up every client's name) would
    wait 10 s for it. ``ip netns exec`` (which starts every daemon there) mounts this
    ``resolv.conf`` over ``/etc/resolv.conf``; it is removed at teardown."""
    folder = NETNS_ETC / namespace
    made = not NETNS_ETC.exists()
    folder.mkdir(parents=True)

    def remove() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                NETNS_ETC.rmdir()  # unless another set of machines uses it now

    cleanup(remove)
    (folder / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


#: How long the machines get, once a test is over, to finish what ends on its own (a SLURM step
#: reporting its end, an SSH session closing) before their daemons stop.
WIND_DOWN_S = 30.0
#: How long whatever outlived the daemons gets to end before it counts as left behind.
LEFT_BEHIND_S = 5.0


def _namespace_of(path: str) -> tuple[int, int] | None:
    """The network namespace ``path`` names (a ``/proc/<pid>/ns/net`` or a ``/run/netns``
    file), as its device and inode; ``None`` for a process gone (or a zombie)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _command_line(pid: int) -> str | None:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return command.replace(b"\0", b" ").decode(errors="replace").strip() or None


def _wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``done`` until it holds or ``timeout_s`` passed; whether it holds."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # polling the machines' process lists, not ordering events
    return True


@dataclass
class Host:
    """One machine: its name, namespace, address and network link (inside its namespace)."""

    name: str
    namespace: str
    address: str
    link: str = ""


class BridgedMachines:
    """``count`` machines named ``{prefix}0``, ``{prefix}1``, ...; everything made for them is
    removed at teardown (``cleanup`` registers what to run then, last first), and a process
    still running on them once their daemons have stopped fails the test."""

    #: Programs of the machinery itself, not of a launch (left out of :meth:`processes`).
    daemons: tuple[str, ...] = ()
    #: Whether each machine numbers its processes itself (a PID namespace of its own): a pid
    #: a process there reports is not this machine's.
    own_pids: bool = False

    def __init__(
        self,
        tmp_path: Path,
        cleanup: Callable[[Callable[[], None]], None],
        count: int = 2,
        prefix: str = "node",
    ) -> None:
        tag = secrets.token_hex(3)
        self._shared = tmp_path  # every machine reaches the test's folder
        self.folder = tmp_path / "machines"
        self.folder.mkdir()
        self._daemons: list[subprocess.Popen[bytes]] = []
        #: Each machine by its network namespace (found by it after its name is gone too).
        self._namespaces: dict[tuple[int, int], Host] = {}
        bridge = f"nbbr{tag}"
        with _choosing_a_subnet():  # chosen and taken before another process looks
            subnet = _free_subnet()
            #: The kernel's address on the bridge (the machines' gateway).
            self.kernel_address = f"{subnet}.254"
            ip("link", "add", bridge, "type", "bridge")
            cleanup(lambda: run("ip", "link", "del", bridge))
            ip("addr", "add", f"{self.kernel_address}/24", "dev", bridge)
        self.hosts = [
            Host(f"{prefix}{i}", f"nbm-{tag}-{i}", f"{subnet}.{i + 1}", f"nbw{tag}{i}")
            for i in range(count)
        ]
        ip("link", "set", bridge, "up")
        for index, host in enumerate(self.hosts):
            ip("netns", "add", host.namespace)
            cleanup(lambda name=host.namespace: run("ip", "netns", "del", name))
            namespace = _namespace_of(f"/run/netns/{host.namespace}")
            assert namespace is not None, host.namespace
            self._namespaces[namespace] = host
            _resolve_nothing(host.namespace, cleanup)
            outside, inside = f"nbv{tag}{index}", host.link
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            cleanup(lambda link=outside: run("ip", "link", "del", link))
            ip("link", "set", outside, "master", bridge)
            ip("link", "set", outside, "up")
            ip("link", "set", inside, "netns", host.namespace)
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
            ip("-n", host.namespace, "link", "set", inside, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
            ip("-n", host.namespace, "route", "add", "default", "via", self.kernel_address)
        cleanup(self._teardown)  # the first to run: the network is still up

    def cut(self, host: Host) -> None:
        """Cut ``host`` off the network (its link down, as a pulled cable): what it sends is
        lost, and nothing tells either side."""
        ip("-n", host.namespace, "link", "set", host.link, "down")

    def mend(self, host: Host) -> None:
        """Put ``host`` back on the network after :meth:`cut`."""
        ip("-n", host.namespace, "link", "set", host.link, "up")
        ip("-n", host.namespace, "route", "replace", "default", "via", self.kernel_address)

    def on(self, host: Host, command: list[str]) -> list[str]:
        """``command`` run on ``host``: in its network namespace, with its own ``/dev/shm``
        and temporary folder, the test's folder shared (see :mod:`own_folders`)."""
        return on_machine(host.namespace, [self._shared], command)

    def daemon(
        self, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` (a daemon of the machinery, in the foreground), ended at teardown."""
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        self._daemons.append(process)
        return process

    def adopt(self, process: subprocess.Popen[bytes]) -> None:
        """Count ``process`` (started on a machine with :meth:`on`) with the machinery's
        daemons: left out of :meth:`processes` (by its pid: what it forks is not), ended at
        teardown."""
        self._daemons.append(process)

    def _end_work(self) -> None:
        """Ask the machinery to end whatever work it still has (a subclass's: the SLURM
        cluster cancels its jobs); the daemons are still up."""

    def _teardown(self) -> None:
        """End the work on the machines while their daemons and network are up, wait for
        what ends on its own, stop the daemons, then fail if anything still runs there
        (ended now: nothing outlives the test)."""
        daemons = {process.pid for process in self._daemons}
        try:
            self._end_work()
            _wait_until(lambda: set(self._running()) <= daemons, WIND_DOWN_S)
        finally:
            for process in reversed(self._daemons):
                process.kill()
                process.communicate()
            _wait_until(lambda: not self._running(), LEFT_BEHIND_S)
            left = [f"{host.name}: {command}" for host, command in self._running().values()]
            _wait_until(self._kill_all, LEFT_BEHIND_S)
        if left:
            pytest.fail(f"processes still ran on the machines after their daemons stopped: {left}")

    def _kill_all(self) -> bool:
        """Kill what runs on the machines; whether nothing did."""
        running = self._running()
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not running

    def _running(self) -> dict[int, tuple[Host, str]]:
        """Every process on the machines now (by its network namespace, wherever its parent
        is): its host and command line."""
        found = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            namespace = _namespace_of(f"/proc/{entry.name}/ns/net")
            host = self._namespaces.get(namespace) if namespace else None
            command = _command_line(int(entry.name)) if host else None
            if host and command:
                found[int(entry.name)] = (host, command)
        return found

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait (up to ``timeout_s``) until nothing of a launch runs on the machines: what ends
        on its own when its channel closes (a kernel killed, a connection dropped)."""
        _wait_until(lambda: not self.processes(), timeout_s)

    def processes(self) -> list[str]:
        """The command lines of the processes running on the machines now, the daemons' left
        out."""
        adopted = {process.pid for process in self._daemons}
        return [
            f"{host.name}: {command}"
            for pid, (host, command) in self._running().items()
            if pid not in adopted and not any(daemon in command for daemon in self.daemons)
        ]
