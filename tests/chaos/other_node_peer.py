"""The other machine of the chaos campaign's ``nodes`` style: for each launch of the kernel
(node 0), :class:`OtherNode` starts node 1 on a machine of its own (forked by
``other_node.py --ready``, which waits there with torch imported, as a second machine's kernel
would), and after the kernel's cell ends it waits for that node to end too: a node left
running once its peer is done is a hang, said as such."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from machines import BridgedMachines
from other_node import SAID_AT

__all__ = ["OtherNode"]

SCRIPT = Path(__file__).with_name("other_node.py")
#: How long node 1 may take to end after node 0's cell did.
END_WAIT_S = 15.0
#: Where node 0 may never have reached the rendezvous (interrupted as it started), how long
#: node 1 is left to end on its own before its user interrupts it (it waits for node 0 at the
#: rendezvous, as it should: node 0 may be run again), and how long it then has to end.
WAITING_S = 3.0
INTERRUPTED_END_S = 5.0
#: How long a node 1 that did not end is given to write its threads' stacks into its log.
STACKS_S = 1.0
#: How long the waiting server may take to start (an interpreter, torch imported) and to
#: fork a run.
READY_S = 120.0


class _Server:
    """``other_node.py --ready`` on ``host`` of ``machines``: it forks each run of node 1 and
    says when it ended; one run at a time."""

    def __init__(self, machines: BridgedMachines, log: Path) -> None:
        command = [sys.executable, str(SCRIPT), "--ready"]
        with open(log, "wb") as output:
            self.process = subprocess.Popen(
                machines.on(machines.hosts[0], command),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=output,
            )
        machines.adopt(self.process)  # it stays between runs: not a launch's leftover
        self._said = b""

    def start(self, request: dict[str, object]) -> int:
        """Fork a node 1 for ``request``; its pid."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        word, pid, *_ = self._line(READY_S).split()
        assert word == "started", f"node 1's server said {word} {pid}"
        return int(pid)

    def ended(self, timeout: float) -> int | None:
        """The exit code of the run, once it ended within ``timeout`` s (``None``: not yet)."""
        try:
            word, _, code = self._line(timeout).split()
        except subprocess.TimeoutExpired:
            return None
        assert word == "ended", f"node 1's server said {word}"
        return int(code)

    def _line(self, timeout: float) -> str:
        """The server's next line, within ``timeout`` s."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._said:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.process.stdout], [], [], max(left, 0.0))
            if not ready:
                raise subprocess.TimeoutExpired("node 1's server", timeout)
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"node 1's server ended (exit code {self.process.wait()})")
            self._said += chunk
        line, _, self._said = self._said.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        """End the server (its input closed: it exits once no run is left)."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.process.stdin = self.process.stdout = None  # closed: the teardown's wait is all


class OtherNode:
    """Node 1 on ``machines.hosts[0]``, launching with ``options`` (the kernel's, node 1's
    rank); each run's output is kept in ``folder`` (``node1-N.log``). ``cleanup`` registers
    the end of its server."""

    def __init__(
        self,
        machines: BridgedMachines,
        options: dict[str, object],
        folder: Path,
        cleanup: Callable[[Callable[[], None]], None],
    ) -> None:
        self._machines = machines
        self._options = {**options, "node_rank": 1}
        self._folder = folder
        self._cleanup = cleanup
        self._server: _Server | None = None
        self._runs = 0
        #: What went wrong with node 1 in the last run (nothing: "").
        self.trouble = ""
        self._ready()  # its interpreter starts while node 0's kernel does

    def _ready(self) -> _Server:
        """The server, started on first use (again, if it ended)."""
        if self._server is None or self._server.process.poll() is not None:
            self._server = _Server(self._machines, self._folder / "node1-server.log")
            self._cleanup(self._server.close)
        return self._server

    @contextlib.contextmanager
    def running(self, plan: dict[str, object], may_wait: bool = False) -> Iterator[None]:
        """Node 1 launching ``plan`` while the block runs node 0's cell; once the block is
        done, node 1 has ended (killed after :data:`END_WAIT_S`, :attr:`trouble` saying so).
        ``may_wait``: node 0 may never have reached the rendezvous; node 1, still waiting
        for it :data:`WAITING_S` later, is interrupted, and must end within
        :data:`INTERRUPTED_END_S`."""
        self._runs += 1
        log = self._folder / f"node1-{self._runs}.log"
        self.trouble = ""
        server = self._ready()
        request = {
            "plan": plan,
            "options": self._options,
            "log": str(log),
            "answers": "c\n" * 4,  # the user's answer to a debugger's prompt
        }
        pid = server.start(request)
        try:
            yield
        finally:
            self._end(server, pid, log, may_wait)

    def _end(self, server: _Server, pid: int, log: Path, may_wait: bool) -> None:
        """Wait for node 1 (``pid``) to end (interrupting it first where it ``may_wait`` for
        node 0); kill it, :attr:`trouble` saying so, when it does not."""
        waited, told = END_WAIT_S, f"{END_WAIT_S:.0f} s after node 0 ended"
        since = time.monotonic()
        if may_wait:
            if server.ended(WAITING_S) is not None:
                return
            os.kill(pid, signal.SIGINT)  # its user stops it: node 0 is not coming
            since = time.monotonic()
            waited, told = INTERRUPTED_END_S, f"{INTERRUPTED_END_S:.0f} s after its interrupt"
        if server.ended(waited) is not None:
            return
        os.kill(pid, signal.SIGUSR1)  # its threads' stacks, into its log
        if server.ended(STACKS_S) is None:
            os.kill(pid, signal.SIGKILL)
            server.ended(READY_S)
        tail = log.read_text(errors="replace")[-6000:]
        said = [line for line in tail.splitlines() if line.startswith(SAID_AT)]
        if said:  # it had said how it ended, and then took its time to exit
            told += f" (it said how it ended {float(said[-1][len(SAID_AT) :]) - since:.1f} s in)"
        self.trouble = f"node 1 still ran {told}: {tail}"
