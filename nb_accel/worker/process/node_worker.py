"""Worker main of a multi-node launch: a process that torch's elastic agent started on a node.

The elastic agent (in the kernel of each node) starts the workers, runs the rendezvous and
restarts the group after a failure; it hands each worker ``LOCAL_RANK``, ``WORLD_SIZE`` and the
address of its store (``MASTER_ADDR``/``MASTER_PORT``). The worker then does what a single-node
worker does: it connects back to its kernel (a Unix socket, authenticated), relays its output
and progress there, joins the process group, runs the function and reports the outcome.

Global ranks follow ``node_rank``: node ``k`` holds ranks ``k * n`` to ``k * n + n - 1``, so
rank 0 is always on the node launched with ``node_rank=0``. Before joining the group every
worker claims its rank in the store, which turns two nodes launched with the same
``node_rank`` into a clear error instead of a hang. A failing rank also writes its failure
into the store (unless it is itself a lost connection or a timeout, which only follow another
failure), so the ranks on other nodes that fail because it went away report the original
error (its type, rank and host) rather than a lost connection.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from multiprocessing.connection import Client, Connection
from typing import Any, TypeVar

import torch.distributed as dist

from ..._messages import Failure
from ...errors import LaunchError, is_peer_loss
from ...runtime.device_types import device_type
from ...runtime.device_types.group_backends import cpu_collectives_only
from ..debugging.awaiting import marked_as_awaiting
from ..debugging.deadline import stop_watching
from ..debugging.post_mortem import has_failure
from ..debugging.prompt_clock import CLOCK_VARIABLE
from ..reporting.channel import EventChannel, current_channel
from ..transfer.segments import SHARE_DIR_ENV
from . import rank_group
from .accelerate_env import accelerate_environment
from .fd_forwarder import forward_file_descriptors
from .lifecycle import RankStart, await_post_mortem, live_as_rank, send_flushed
from .outcomes import Outcome, deadline_failure, failure_event, waited_in_another
from .rank_group import OwnDeadline, bound_device, leave_process_group, use_rank_device
from .spec import Payload, unpack_payload
from .trainer_support import set_up_training_arguments

__all__ = [
    "NodeWorkerArgs",
    "global_rank",
    "keep_store_for_readers",
    "node_worker_main",
    "recorded_failure",
    "relay_death",
]

#: How long a rank whose collective broke waits for another rank's failure to show up.
PEER_FAILURE_WAIT_S = 2.0
_FIRST_FAILURE = "first_failure"
#: The first collective timeout of a rank: why a rank that came late found its peers gone.
_FIRST_TIMEOUT = "first_timeout"
_T = TypeVar("_T")
#: How long an agent relaying a death, or a rank, waits for the workers' store to answer.
RELAY_TIMEOUT_S = 2.0
#: How long past its own wait a rank's look for another's failure may take to be answered.
ANSWER_SLACK_S = 0.5
#: After a failure, how long the node hosting the workers' store keeps it for the other
#: nodes' ranks to read the failure there (they wait for one up to PEER_FAILURE_WAIT_S).
FAILURE_READ_S = PEER_FAILURE_WAIT_S + 1.0
#: After a collective timeout (and no failure), how long that node keeps it for a rank that
#: comes late to read the timeout there: a rank stuck for good never comes, and the other
#: nodes learn that the launch ended only once the store's node closes the rendezvous.
TIMEOUT_READ_S = 1.5
_SETTLED = "settled"
_ABORT = "abort"


@dataclass(frozen=True)
class NodeWorkerArgs:
    """What every worker of one node needs (plain data: it is pickled for ``spawn``).

    Attributes:
        address: the kernel's listening socket.
        authkey: the secret a worker proves it belongs to this launch with.
        node_rank: this node's number.
        num_nodes: the number of nodes.
        backend: ``"gloo"``, ``"nccl"``, or ``"cuda:nccl,cpu:gloo"`` (FSDP on GPUs).
        device_type: the device type's registered name (``"cpu"``, ``"cuda"``).
        timeout_s: bound on every collective, in seconds.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``.
        payload: the cloudpickled ``(function, args, kwargs)`` (or the call itself, for
            workers forked from the process that holds it).
        env: extra environment variables set before anything else.
        alone: whether this node's kernel sees only this node's workers (a launch with
            ``num_nodes``); not for a launch on hosts, whose kernel hears every node's.
        post_mortem_s: if the function raises here, how long the worker waits, paused, for
            the kernel's ``%debug`` (0: it ends at once); a launch on hosts without restarts.
    """

    address: str
    authkey: bytes
    node_rank: int
    num_nodes: int
    backend: str
    device_type: str
    timeout_s: float
    mixed_precision: str
    payload: Payload
    env: dict[str, str] = field(default_factory=dict)
    alone: bool = True
    post_mortem_s: float = 0.0


def global_rank(node_rank: int, local_rank: int, per_node: int) -> int:
    """The rank of ``local_rank`` on node ``node_rank`` when every node runs ``per_node``."""
    return node_rank * per_node + local_rank


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"{name} is not set: this function runs under torch's elastic agent")
    return int(value)


class _Node:
    """Where this worker stands: its ranks, its host, and the store of its attempt."""

    def __init__(self, args: NodeWorkerArgs) -> None:
        self.args = args
        self.local_rank = _env_int("LOCAL_RANK")
        self.per_node = _env_int("LOCAL_WORLD_SIZE")
        self.world_size = _env_int("WORLD_SIZE")
        # the attempt's number, the same on every node (the agent gives it: torch's differs)
        restarts = args.env.get("TORCHELASTIC_RESTART_COUNT")
        self.attempt = int(restarts or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.rank = global_rank(args.node_rank, self.local_rank, self.per_node)
        self.host = socket.gethostname()
        self.store: Any = None
        #: Whether a call to the store went unanswered (its host cut off): no more are made.
        self.store_lost = False

    def environment(self) -> dict[str, str]:
        """The variables a single-node worker sets too, with this node's ranks."""
        variables = {
            "RANK": str(self.rank),
            "GROUP_RANK": str(self.args.node_rank),
            "NODE_RANK": str(self.args.node_rank),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "NB_ACCEL_LAUNCHED": "1",
            "NB_ACCEL_MIXED_PRECISION": self.args.mixed_precision,
            "NB_ACCEL_BACKEND": self.args.backend,
            **accelerate_environment(device_type(self.args.device_type), self.args.mixed_precision),
        }
        variables.update(self.args.env)
        return variables

    def connect_store(self) -> None:
        """The elastic agent's store for this attempt, under a prefix of our own; its waits
        (NCCL's exchange of its communicator's id among them) allow the launch's timeout."""
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.store = _attempt_store(address, port, self.attempt, self.args.timeout_s)

    def check_layout(self) -> None:
        """Fail clearly when the nodes disagree on their numbers or sizes."""
        expected = self.per_node * self.args.num_nodes
        if self.world_size != expected:
            raise RuntimeError(
                f"the rendezvous formed a group of {self.world_size} processes, but "
                f"{self.args.num_nodes} nodes of {self.per_node} make {expected}: launch every "
                "node with the same num_processes and num_nodes"
            )

    def claim_rank(self) -> None:
        """Claim this rank in the store and wait until every rank is claimed."""
        me = f"{self.host} (pid {os.getpid()})"
        owner = self.store.compare_set(f"rank/{self.rank}", "", me).decode()
        if owner != me:
            message = (
                f"two nodes were launched with node_rank={self.args.node_rank} ({owner} and "
                f"{me}): give each node its own node_rank, from 0 to {self.args.num_nodes - 1}"
            )
            self.store.set(_ABORT, message)
            raise ValueError(message)
        claimed = self.store.add("claimed", 1)
        deadline = time.monotonic() + self.args.timeout_s
        while claimed < self.world_size:
            if self.store.check([_ABORT]):
                raise ValueError(self.store.get(_ABORT).decode())
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {claimed} of {self.world_size} ranks started within "
                    f"{self.args.timeout_s:g} s"
                )
            time.sleep(0.005)
            claimed = self.store.add("claimed", 0)

    def join_group(self) -> None:
        """Join the process group with this node's global rank. A worker whose node keeps a
        prompt clock (a launch across hosts) keeps its collective timeout itself, the time at
        the kernel's prompts left out."""
        use_rank_device(self.args.device_type, self.local_rank, self.per_node)
        channel = current_channel()
        report = None if channel is None else partial(_report_timeout, self, channel)
        deadline = OwnDeadline(self.args.timeout_s, os.environ.get(CLOCK_VARIABLE, ""), report)
        dist.init_process_group(
            self.args.backend,
            store=dist.PrefixStore("group", self.store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=deadline.group_timeout(),
            device_id=bound_device(self.args.device_type, self.local_rank),
        )
        deadline.start()
        if cpu_collectives_only(self.args.backend):
            dist.barrier()
            deadline.connected()

    def publish_failure(self, failure: Failure) -> None:
        """Record ``failure`` as the launch's first unless another rank's came first (a
        collective timeout: as its first timeout)."""
        store, key = self.store, _FIRST_TIMEOUT if failure.is_timeout else _FIRST_FAILURE
        self._ask(RELAY_TIMEOUT_S, lambda: _publish(store, failure, key))

    def settled(self) -> None:
        """Count this rank as settled (see :func:`keep_store_for_readers`)."""
        store = self.store
        self._ask(RELAY_TIMEOUT_S, lambda: store.add(_SETTLED, 1))

    def peer_failure(self, wait_s: float, timeouts: bool = False) -> Failure | None:
        """Another rank's failure recorded in the store (waiting up to ``wait_s`` for one; a
        store that does not answer, its host cut off, is given up after that too);
        ``timeouts``: or another rank's collective timeout, when no failure is."""
        return self._ask(wait_s + ANSWER_SLACK_S, lambda: self._peer_failure(wait_s, timeouts))

    def _ask(self, seconds: float, call: Callable[[], _T]) -> _T | None:
        """What ``call`` to the store returns (``None``: it raised, or the store is lost);
        a store that has not answered within ``seconds`` is lost."""
        if self.store is None or self.store_lost:
            return None
        answered, value = _within(seconds, call)
        self.store_lost = not answered
        return value

    def _peer_failure(self, wait_s: float, timeouts: bool) -> Failure | None:
        deadline = time.monotonic() + wait_s
        keys = (_FIRST_FAILURE, _FIRST_TIMEOUT) if timeouts else (_FIRST_FAILURE,)
        while True:
            for key in keys:
                if self.store.check([key]):
                    failure = pickle.loads(self.store.get(key))
                    return failure if failure.rank != self.rank else None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


def _within(seconds: float, call: Callable[[], _T]) -> tuple[bool, _T | None]:
    """Whether ``call`` returned within ``seconds``, and what it returned (``None`` when it
    raised): a call to a store whose host was cut off waits for an answer as long as the
    system keeps the connection (many minutes). Its thread is then left to this worker's
    end, which comes next."""
    answers: list[_T | None] = []

    def ask() -> None:
        try:
            answers.append(call())
        except Exception:  # noqa: BLE001 - the store may be gone with its node
            answers.append(None)

    thread = threading.Thread(target=ask, name="nb_accel-store-call", daemon=True)
    thread.start()
    thread.join(seconds)
    return (True, answers[0]) if answers else (False, None)


def _attempt_store(address: str, port: int, attempt: int, timeout_s: float) -> Any:
    """A client of the workers' store (``address:port``) under attempt ``attempt``'s prefix."""
    tcp = dist.TCPStore(address, port, None, False, timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"nb_accel/attempt_{attempt}", tcp)


def _publish(store: Any, failure: Failure, key: str = _FIRST_FAILURE) -> None:
    try:
        store.compare_set(key, "", pickle.dumps(failure))
    except Exception:  # noqa: BLE001 - the store may be gone with its node
        pass


def relay_death(address: str, port: int, attempt: int, failure: Failure) -> None:
    """Record ``failure``, a worker of this node that died without reporting (its agent saw
    it end), as attempt ``attempt``'s first failure in the workers' store at ``address:port``
    unless another rank's came first: the ranks on the other nodes that lost their connection
    to it then report how it died, not their lost connection."""
    try:
        store = _attempt_store(address, port, attempt, RELAY_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the store may be gone with its node
        return
    _publish(store, failure)


def recorded_failure(address: str, port: int, attempt: int) -> Failure | None:
    """What the ranks of attempt ``attempt`` recorded first in the workers' store at
    ``address:port``: a failure, else a collective timeout (``None``: neither, or the store is
    gone with its node). A node another node's end found with ranks still running says it."""

    def read() -> Failure | None:
        # a store gone with its node: said at once, without the store client's retries (and
        # the errors it writes for each)
        socket.create_connection((address, port), timeout=RELAY_TIMEOUT_S).close()
        store = _attempt_store(address, port, attempt, RELAY_TIMEOUT_S)
        for key in (_FIRST_FAILURE, _FIRST_TIMEOUT):
            if store.check([key]):
                found = pickle.loads(store.get(key))
                return found if isinstance(found, Failure) else None
        return None

    return _within(RELAY_TIMEOUT_S + ANSWER_SLACK_S, read)[1]


def keep_store_for_readers(address: str, port: int, attempt: int, ranks: int) -> None:
    """On the node hosting the workers' store (``address:port``), once its own workers of
    attempt ``attempt`` are done: when a failure was recorded there, wait until each of the
    ``ranks`` has settled (:func:`_settle`: read the failure, or had its own), at most
    :data:`FAILURE_READ_S` (:data:`TIMEOUT_READ_S` after a collective timeout), before the
    node ends and its store with it. The other nodes' ranks whose connection broke read there
    what failed, or which rank gave up waiting for them."""
    try:
        store = _attempt_store(address, port, attempt, RELAY_TIMEOUT_S)
        if store.check([_FIRST_FAILURE]):
            keep_s = FAILURE_READ_S
        elif store.check([_FIRST_TIMEOUT]):
            keep_s = TIMEOUT_READ_S
        else:
            return
        deadline = time.monotonic() + keep_s
        while store.add(_SETTLED, 0) < ranks and time.monotonic() < deadline:
            time.sleep(0.02)
    except Exception:  # noqa: BLE001 - a store of its own: it answers, or is gone
        pass


def _report_timeout(
    node: _Node, channel: EventChannel, message: str, where: str, stack: str, at_prompt: bool
) -> None:
    """Past the rank's own deadline: report the timeout, marked with the host."""
    failure = deadline_failure(node.rank, message, where, stack, at_prompt)
    send_flushed(channel, _with_host(failure, node.host))


def _failure(node: _Node, exc: BaseException, own_files: tuple[str, ...]) -> Failure:
    """What to report for ``exc``: another rank's original failure when this one only
    followed from it (a lost connection), else this rank's own, marked with its host. After a
    timeout elsewhere, this rank's own: its lost connection (it came late to that collective)
    or its wait in another collective."""
    own = _with_host(failure_event(node.rank, exc, own_files), node.host)
    lost = is_peer_loss(own.message) and not own.is_timeout
    # a rank that timed out looks once: a failure that kept a rank away was recorded before
    first = node.peer_failure(PEER_FAILURE_WAIT_S if lost else 0.0, timeouts=lost)
    if first is not None and first.is_timeout:  # it gave up waiting for this rank
        channel = current_channel()
        if channel is not None:  # the kernel judges both, as one node's would
            send_flushed(channel, first)
        # late to that collective, or waiting in another one (seed 8034)
        waited = waited_in_another(node.rank, exc, first, own_files) if lost else None
        return own if waited is None else _with_host(waited, node.host)
    if first is None and lost and node.args.alone and node.args.num_nodes > 1:
        return _left_first(node, exc, own_files)
    if first is not None and first.type_name == "builtins.KeyboardInterrupt":
        stopped = LaunchError(
            f"rank {first.rank} (host {first.host}) was interrupted: its node's launch was "
            "stopped, so the ranks here stopped too"
        )
        return _with_host(failure_event(first.rank, stopped), first.host)
    return first if first is not None else own


def _left_first(node: _Node, exc: BaseException, own_files: tuple[str, ...]) -> Failure:
    """This rank's failure when its connections were lost and nothing was recorded of why
    (the store gone with its node): another node ended the launch first. Said with the
    rank's own frames (where it called the collective), the connection's words in a note."""
    ended = LaunchError(
        f"rank {node.rank}'s connections to another node's ranks were closed as it came to a "
        "collective: that node ended the launch first (one of its ranks failed, or gave up "
        "waiting for the ranks here in a collective timeout, or it was stopped). That node's "
        "own output says which"
    ).with_traceback(exc.__traceback__)
    if hasattr(ended, "add_note"):  # Python 3.11 and later
        ended.add_note(f"The collective said: {(str(exc) or repr(exc)).splitlines()[0]}")
    return _with_host(failure_event(node.rank, ended, own_files), node.host)


def _with_host(failure: Failure, host: str) -> Failure:
    """``failure`` marked with the host its rank ran on."""
    return dataclasses.replace(failure, host=host)


def _settle(node: _Node, outcome: Outcome) -> Outcome:
    """This rank's own failure marked with its host and, when it may be the root cause or is
    a collective timeout, relayed to the other ranks through the store (a lost peer is only a
    consequence); the rank counted as settled there."""
    if isinstance(outcome, Failure) and outcome.rank == node.rank:
        outcome = _with_host(outcome, node.host)
        if outcome.is_timeout or not is_peer_loss(outcome.message):
            node.publish_failure(outcome)
    node.settled()
    return outcome


def _connect(node: _Node) -> Connection:
    """Connect to this node's kernel: its file descriptors 1 and 2 (C++ and CUDA output,
    ``os.write``, programs) through a forwarder, and the event channel's connection."""
    args = node.args
    forwarder = Client(args.address, family="AF_UNIX", authkey=args.authkey)
    forward_file_descriptors(forwarder, node.rank)
    forwarder.close()  # the forwarder's own now
    return Client(args.address, family="AF_UNIX", authkey=args.authkey)


def _run_function(node: _Node) -> Any:
    function, fargs, fkwargs = unpack_payload(node.args.payload)
    node.check_layout()
    node.connect_store()
    node.claim_rank()
    node.join_group()
    set_up_training_arguments()  # 🤗 TrainingArguments made in the kernel: this rank's devices
    return function(*fargs, **fkwargs)


def _keeps_frames(node: _Node, failure: Failure) -> bool:
    """Whether this rank waits for ``%debug`` after ``failure``: its own exception (not a
    lost peer, nor a timeout: consequences of another rank's failure), in a launch whose
    kernel keeps a rank for it."""
    return (
        node.args.post_mortem_s > 0
        and failure.rank == node.rank
        and not failure.is_timeout
        and not is_peer_loss(failure.message)
        and has_failure()
    )


def _wait_for_debugger(node: _Node, channel: EventChannel) -> None:
    """Wait, marked for the agent (which then leaves this worker running), for the kernel to
    open the debugger here; the process group is let go first, so that the ranks waiting
    for this one fail at once."""
    folder = node.args.env.get(SHARE_DIR_ENV)
    if not folder:
        return
    with marked_as_awaiting(folder):
        await_post_mortem(channel, node.args.post_mortem_s)


def node_worker_main(args: NodeWorkerArgs) -> None:
    """Run the launch's function as one rank of a multi-node group (elastic's entrypoint).

    Returns ``None`` on success (the result travels to the kernel over the event channel);
    on failure it reports and ends the process with exit code 1, which the elastic agent sees
    as this worker's failure (and restarts the group when restarts are left).
    """
    node = _Node(args)
    # A process group of its own, as every worker: Jupyter sends its interrupt to the kernel's
    # whole group, and a node's worker must hear it only through its agent. Heard at once,
    # it struck the worker as torch's agent woke it to exit, and the worker released the
    # agent's lock of that wake-up a second time (the agent, in the kernel, then failed on
    # its own release: "semaphore or lock released too many times").
    start = RankStart(node.rank, node.environment(), attempt=node.attempt)
    channel, outcome = live_as_rank(
        start,
        lambda: _connect(node),
        lambda: _run_function(node),
        own_files=(__file__, rank_group.__file__),
        explain=lambda exc, files: _failure(node, exc, files),
        settle=lambda outcome: _settle(node, outcome),
    )
    stop_watching()
    if isinstance(outcome, Failure) and _keeps_frames(node, outcome):
        _wait_for_debugger(node, channel)
    channel.close()
    if isinstance(outcome, Failure):
        os._exit(1)
    leave_process_group()
