"""The other machine of the chaos campaign's ``nodes`` style: for each launch of the kernel
(node 0), :class:`OtherNode` starts ``other_node.py`` (node 1) on a machine of its own, and
after the kernel's cell ends it waits for that node to end too: a node left running once its
peer is done is a hang, said as such."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from machines import BridgedMachines

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


class OtherNode:
    """Node 1 on ``machines.hosts[0]``, launching with ``options`` (the kernel's, node 1's
    rank); each run's output is kept in ``folder`` (``node1-N.log``)."""

    def __init__(self, machines: BridgedMachines, options: dict[str, object], folder: Path) -> None:
        self._machines = machines
        self._options = {**options, "node_rank": 1}
        self._folder = folder
        self._runs = 0
        #: What went wrong with node 1 in the last run (nothing: "").
        self.trouble = ""

    @contextlib.contextmanager
    def running(self, plan: dict[str, object], may_wait: bool = False) -> Iterator[None]:
        """Node 1 launching ``plan`` while the block runs node 0's cell; once the block is
        done, node 1 has ended (killed after :data:`END_WAIT_S`, :attr:`trouble` saying so).
        ``may_wait``: node 0 may never have reached the rendezvous; node 1, still waiting
        for it :data:`WAITING_S` later, is interrupted, and must end within
        :data:`INTERRUPTED_END_S`."""
        self._runs += 1
        log = self._folder / f"node1-{self._runs}.log"
        command = [sys.executable, str(SCRIPT), json.dumps(plan), json.dumps(self._options)]
        self.trouble = ""
        with open(log, "wb") as output:
            process = subprocess.Popen(
                self._machines.on(self._machines.hosts[0], command),
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        assert process.stdin is not None
        try:
            process.stdin.write(b"c\n" * 4)  # the user's answer to a debugger's prompt
            process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            yield
        finally:
            self._end(process, log, may_wait)

    def _end(self, process: subprocess.Popen[bytes], log: Path, may_wait: bool) -> None:
        """Wait for node 1 to end (interrupting it first where it ``may_wait`` for node 0);
        kill it, :attr:`trouble` saying so, when it does not."""
        waited, told = END_WAIT_S, f"{END_WAIT_S:.0f} s after node 0 ended"
        if may_wait:
            try:
                process.wait(WAITING_S)
                return
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGINT)  # its user stops it: node 0 is not coming
            waited, told = INTERRUPTED_END_S, f"{INTERRUPTED_END_S:.0f} s after its interrupt"
        try:
            process.wait(waited)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)  # its threads' stacks, into its log
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STACKS_S)
            process.kill()
            process.wait()
            tail = log.read_text(errors="replace")[-6000:]
            self.trouble = f"node 1 still ran {told}: {tail}"
