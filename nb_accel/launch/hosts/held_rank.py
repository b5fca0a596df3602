"""A launch's rank on a host, kept after the launch for ``%debug``: the kernel reaches it
through its host's node process, which alone is left running (with what holds its place: a
Ray node's actor and placement group) until the post-mortem ends or the rank is let go.

It is the kept rank's process for :class:`~nb_accel.launch.debugging.kept_rank.KeptRank`,
which runs the post-mortem as for a rank of this machine.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from ..._messages import Event, Forwarded, Output, Prompt, ToWorker
from .connections import HOST_STOP_GRACE_S, HostNodes, NodeChannel

__all__ = ["HeldOnHost"]


class HeldOnHost:
    """Rank ``rank``, on ``node`` (the last of ``nodes`` left running), as the kept rank's
    process.

    Args:
        nodes: the launch's node processes, every other one stopped: stopping this rank
            stops the last and lets go of the hosts.
        node: its host's node process.
        number: its connection's number on that node.
        rank: the rank.
        host_of: the host of each rank, as the user named it (``None``: this node's).
    """

    def __init__(
        self,
        nodes: HostNodes,
        node: NodeChannel,
        number: int,
        rank: int,
        host_of: Callable[[int], str] | None,
    ) -> None:
        self.rank = rank
        self._nodes = nodes
        self._node = node
        self._number = number
        self._host_of = host_of
        self._waiting: collections.deque[Event] = collections.deque()

    def ended(self) -> bool:
        """Whether its host's agent has ended (the rank with it), or the channel did."""
        return not self._node.open or self._node.ended is not None

    def send(self, data: bytes) -> None:
        """Through its node process."""
        if not self._node.open:
            raise OSError(f"the connection to host {self._node.host} has ended")
        self._node.tell(ToWorker(self._number, data))

    def receive(self, timeout: float | None) -> Event | None:
        """What the rank writes and asks (the rest of what its node sends is not the
        debugger's); ``EOFError`` once its node has ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._waiting:
            if self.ended():
                raise EOFError
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            for node in self._nodes.readable(left):  # a silent host is given up there
                for message in node.messages():
                    if isinstance(message, Forwarded):
                        event = node.event(message, self._host_of)
                        if isinstance(event, (Output, Prompt)) and event.rank == self.rank:
                            self._waiting.append(event)
        return self._waiting.popleft()

    def stop(self) -> None:
        """Stop its node (its agent stops the rank) and let go of the hosts."""
        self._nodes.stop(HOST_STOP_GRACE_S)
