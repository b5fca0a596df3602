"""Run one chaos scenario in a real Jupyter kernel and check the invariants after it.

The kernel is the user's: it saves a configuration (a short collective timeout, no rank kept
for ``%debug``), defines the training function, runs the scenario's cell in its style, with
its fault, answering any prompt as a user would (``c``), interrupting or killing the kernel at
the scenario's moment; then it runs a clean cell in the same style, stops its workers, and the
runner looks at what is left. Every invariant broken is said with what was seen, so that a
seed that broke one tells its story.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient
from kernel_driver import running_kernel
from machines import BridgedMachines, require
from notebook_code import (
    CONFIG,
    DISK_BYTES,
    FILL_SHM,
    FUNCTIONS,
    HOSTS,
    RANKS,
    SMALL_SHM,
    TIMEOUT_S,
    fault_cell,
    follow_up_cell,
    plan_of,
)
from other_node_peer import OtherNode
from ports import free_port
from ray_cluster import RayCluster
from scenarios import OWN_KERNEL, Scenario
from slurm_cluster import SlurmCluster, require_slurm_cluster
from small_disk import small_disk
from ssh_hosts import SshMachines, require_ssh_machines

from nb_accel.launch.launchers.outcome import CAME_LATE, RETURNED_LATER

__all__ = [
    "INVARIANTS",
    "PHASES",
    "HeldKernel",
    "KernelSession",
    "Outcome",
    "StyleKernels",
    "bound_of",
    "kernel_session",
    "run_scenario",
]

#: A piece of text an error must say: a word, or a tuple of words any one of which will do.
Wanted = str | tuple[str, ...]

#: What must hold after every scenario.
INVARIANTS = (
    "ends in time",  # timeout + 5 s after a wait or a flood, 3 s another fault, 2 s an interrupt
    "names the fault",  # the error names the faulty rank and what happened
    "resumes exactly",  # a max_restarts run ends where a clean run ends
    "pool keeps namespaces",  # the pool's other ranks keep their variables
    "next run works",  # a clean run in the same kernel works
    "checkpoints whole",  # every checkpoint is the one a clean run writes at its step
    "nothing left",  # no process, /dev/shm entry or scratch file; the kernel's threads, descriptors
    "no orphans",  # a killed kernel leaves no worker behind
)
#: The phases of a scenario whose time is measured: its own kernel started and shut down
#: (with its machines), the style's set-up (a pool started, warmed), the fault's run, the
#: clean run after it, the workers stopped, the checks of what is left.
PHASES = ("own kernel", "set-up", "fault run", "next run", "stop", "checks")
#: Past the collective timeout, how long the cell of a fault that waits for it may take to end.
END_MARGIN_S = 5.0
#: How long the cell of a fault that is not a wait may take to end: under the collective
#: timeout, so that a cell that waited for it is seen.
FAULT_BOUND_S = 3.0
#: The faults that leave the other ranks waiting until the collective timeout.
WAITS = ("sigstop", "stuck-own", "stuck-collective", "link-cut")
#: The faults whose ranks go on to the end, slowed: the issue's bound (the timeout + 5 s) is
#: theirs, since the time their output takes to reach the notebook grows with its size and
#: the machine's load, and ends in no error either way.
SLOWED = ("print-flood",)
#: How long an interrupted cell may take to end.
INTERRUPT_BOUND_S = 2.0
#: The runner's own bound on one cell: past it the cell is interrupted and counted as a hang.
CELL_CAP_S = 90.0
#: What others keep in the scratch folder on purpose: the kernel's cell files, torch's caches.
OTHERS = ("ipykernel_", "torchinductor_")
#: The styles of this machine whose ranks torch's elastic agent starts.
AGENT_STYLES = ("restarts", "nodes")
#: What a ``max_restarts`` run (or a node's) says with a full ``/dev/shm``: torch's agent
#: starts its workers with Python's multiprocessing queues, whose locks need room there (a
#: limit of the system, said before any worker starts).
SHM_LIMIT = "Its workers' queues need room in /dev/shm (0 MB free"
#: The file that fills the kernel's own ``/dev/shm`` in a ``shm-full`` scenario.
SHM_FILLER = "/dev/shm/chaos-filler"
#: How long the kernel's descriptors get to close after a scenario (see :func:`_settled`).
DESCRIPTORS_SETTLE_S = 5.0
#: How long the workers of a killed kernel get to end.
ORPHAN_WAIT_S = 15.0


@dataclass
class CellEnd:
    """How a cell ended: its status, error, output, and when (monotonic seconds)."""

    status: str = ""
    ename: str = ""
    evalue: str = ""
    traceback: str = ""
    stdout: str = ""
    stderr: str = ""
    result: str = ""
    ended_at: float = 0.0
    prompts: int = 0
    prompt_at: float | None = None
    capped: bool = False


@dataclass
class Outcome:
    """What a scenario did: the invariants it broke (with what was seen), and how long its
    fault took to end its cell (from the fault, or the interrupt)."""

    scenario: Scenario
    broken: dict[str, str] = field(default_factory=dict)
    seconds_to_end: float | None = None
    #: Where the scenario's time went: seconds by phase (see :data:`PHASES`).
    phases: dict[str, float] = field(default_factory=dict)

    def fail(self, invariant: str, seen: str) -> None:
        """Count ``invariant`` broken, ``seen`` saying how."""
        self.broken.setdefault(invariant, seen[:2000])

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the block's time to ``phase``'s."""
        started = time.monotonic()
        try:
            yield
        finally:
            taken = time.monotonic() - started
            self.phases[phase] = self.phases.get(phase, 0.0) + taken


def _run(
    client: BlockingKernelClient,
    code: str,
    manager: KernelManager | None = None,
    marker: Path | None = None,
    action: Callable[[], None] | None = None,
    answer_after: float = 0.0,
    kills: bool = False,
) -> tuple[CellEnd, float | None]:
    """Run ``code``; answer prompts with ``c``, ``answer_after`` seconds after each opens. With
    ``action`` (an interrupt, the kernel killed, a host cut off), do it once ``marker`` exists
    (as the cell starts when it is None); return how the cell ended (at once after an action
    that ``kills`` the kernel) and when the marker was seen (or the action done)."""
    msg_id = client.execute(code, allow_stdin=True, store_history=False, stop_on_error=False)
    end, seen_at = CellEnd(), None
    started = time.monotonic()
    acted = action is None
    while True:
        if not acted and marker is not None and marker.exists():
            seen_at = time.monotonic()
            assert action is not None
            action()
            acted = True
        if kills and acted:
            end.ended_at = time.monotonic()
            return end, seen_at
        if not end.capped and time.monotonic() - started > CELL_CAP_S:
            end.capped = True
            assert manager is not None
            manager.interrupt_kernel()
        if time.monotonic() - started > CELL_CAP_S + 30:
            end.status, end.ended_at = "hung", time.monotonic()
            return end, seen_at
        _answer_prompts(client, end, answer_after)
        try:
            message = client.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if not acted and marker is None and kind == "status":  # the cell has started
            seen_at = time.monotonic()
            assert action is not None
            action()
            acted = True
        if kind == "stream":
            setattr(end, content["name"], getattr(end, content["name"]) + content["text"])
        elif kind == "execute_result":
            end.result = content["data"].get("text/plain", "")
        elif kind == "error":
            end.ename, end.evalue = content["ename"], content["evalue"]
            end.traceback = "\n".join(content["traceback"])
        elif kind == "status" and content["execution_state"] == "idle":
            end.ended_at = time.monotonic()
            end.status = "error" if end.ename else "ok"
            return end, seen_at


def _answer_prompts(client: BlockingKernelClient, end: CellEnd, after: float) -> None:
    """Answer ``c`` to the open prompt ``after`` seconds after it opened."""
    if end.prompt_at is None:
        try:
            client.get_stdin_msg(timeout=0)
        except queue.Empty:
            return
        end.prompts += 1
        end.prompt_at = time.monotonic()
    if time.monotonic() - end.prompt_at >= after:
        end.prompt_at = None
        client.input("c")


def _kill(kernel: psutil.Process) -> None:
    os.kill(kernel.pid, signal.SIGKILL)


def _cut_host(machines: BridgedMachines, rank: int) -> Any:
    """The host of rank ``rank`` (of the ``nodes`` style, whose kernel is node 0, and of the
    ``ray`` style, whose kernel is on the head with rank 0: the other node's, cut off from the
    kernel's either way)."""
    if isinstance(machines, RayCluster):
        return machines.node
    return machines.hosts[min(rank, len(machines.hosts) - 1)]


def _cut(machines: BridgedMachines, rank: int, marks: Path) -> None:
    """Cut rank ``rank``'s host off the network, then let the rank go on (it waits for this)."""
    machines.cut(_cut_host(machines, rank))
    (marks / "cut").touch()


def _kernel_process(manager: KernelManager) -> psutil.Process:
    """The kernel's process: the one its manager started, or that one's child where it was
    ``nsenter`` into a PID namespace (which forks the command it runs)."""
    started = psutil.Process(manager.provisioner.process.pid)  # type: ignore[union-attr]
    if not started.cmdline()[0].endswith("nsenter"):
        return started
    children = started.children()
    assert len(children) == 1, children  # the kernel has answered: it runs
    return children[0]


def _pid_inside(pid: int) -> int:
    """``pid`` as its own PID namespace numbers it (as it names what it makes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def _shm(root: str = "") -> set[str]:
    """What ``/dev/shm`` holds (``root``: of the machine whose file system is seen there)."""
    try:
        return set(os.listdir(f"{root}/dev/shm"))
    except OSError:
        return set()


def _worker_pids(marks: Path) -> set[int]:
    return {int(path.name.split("-")[2]) for path in marks.glob("pid-*")}


def _expect_error(outcome: Outcome, end: CellEnd, machines: BridgedMachines | None = None) -> None:
    """The error of a fault's cell names the faulty rank and what happened."""
    scenario = outcome.scenario
    rank, fault, text = scenario.rank, scenario.fault, end.evalue + "\n" + end.traceback
    host = f"{'sn' if scenario.style == 'slurm' else 'node'}{rank}"  # the rank's, where on hosts
    wanted: dict[str, tuple[str, list[Wanted]]] = {
        "raise": ("ValueError", [f"chaos on rank {rank}", f"Raised on rank {rank} of"]),
        "sigkill": ("WorkerDiedError", [f"rank {rank}", "SIGKILL"]),
        "sigstop": ("", [f"ank {rank}", "frozen"]),  # a timeout, or the frozen rank's end
        "stuck-own": ("CollectiveTimeoutError", [f"Rank {rank} did not arrive"]),
        "stuck-collective": ("", [f"ank {rank}"]),
        "breakpoint-and-raise": ("ValueError", [f"chaos on rank {1 - rank}"]),
        "disk-full": ("", ["No space left on device", "save_state"]),
        "killed-in-save": ("WorkerDiedError", [f"rank {rank}", "SIGKILL"]),
        "link-cut": ("", [f"ank {rank}", f"host {host} ended", "no word from the host"]),
    }
    if scenario.style == "nodes":  # the kernel is node 0 (rank 0); it sees no other node's rank
        wanted.update(_nodes_wanted(scenario))
    if isinstance(machines, RayCluster):  # hosts named by address; the node cut holds rank 1
        cut = ["ank 1", f"host {machines.node.address} ended", "no word from the host"]
        wanted["link-cut"] = ("", cut)
    if fault not in wanted:
        return
    ename, pieces = wanted[fault]
    if end.status != "error" or (ename and end.ename != ename):
        outcome.fail("names the fault", f"{end.status} {end.ename}: {end.evalue}")
        return
    missing = [piece for piece in pieces if not _said(piece, text)]
    if missing:
        outcome.fail("names the fault", f"{end.ename} lacks {missing}: {text}")


def _said(piece: Wanted, text: str) -> bool:
    """Whether ``text`` says ``piece`` (a tuple: any one of its words)."""
    return any(one in text for one in piece) if isinstance(piece, tuple) else piece in text


def _nodes_wanted(scenario: Scenario) -> dict[str, tuple[str, list[Wanted]]]:
    """What node 0's error says where the ranks of the ``nodes`` style wait: of rank 1 on
    node 1 (or cut off with it), that it did not arrive and is on node 1, whose own launch
    says more; of its own rank 0 that waits, where it was (frozen, or in its own code) when
    node 1 ended the launch: with node 1's timeout, read in the workers' store (seeds 8245 and
    8140), or, where the store had gone with node 1, that node 1 ended the launch."""
    elsewhere: tuple[str, list[Wanted]] = (
        "CollectiveTimeoutError",
        ["Rank 1 did not arrive", "is on node 1"],
    )
    if scenario.rank == 1:
        wanted = dict.fromkeys(("sigstop", "stuck-own", "link-cut"), elsewhere)
        # rank 1's receive may time out first: rank 0 then says where each waited (seed 8034)
        crossed = ("Rank 1 did not arrive (is on node 1", "rank 1 in recv (point-to-point)")
        return {**wanted, "stuck-collective": ("CollectiveTimeoutError", [crossed])}
    return {
        "sigstop": ("", ["ank 0", "frozen"]),
        "stuck-own": ("", ["ank 0", "chaos_strike"]),
        "link-cut": elsewhere,
    }


def _results(end: CellEnd) -> Any:
    """The ranks' results a cell printed (a launch) or stored (``-o``), as Python values."""
    import ast

    line = end.stdout.strip().splitlines()[-1] if end.stdout.strip() else ""
    try:
        return ast.literal_eval(line)
    except (ValueError, SyntaxError):
        return None


@dataclass
class KernelSession:
    """A kernel the scenarios run in, set up as a user's (its configuration saved, the training
    function defined), under ``folder`` (its ``TMPDIR``: ``folder/scratch``). Once it has shut
    down, ``left`` says what it left behind (its ``/dev/shm`` folders, scratch files)."""

    manager: KernelManager
    client: BlockingKernelClient
    kernel: psutil.Process
    folder: Path
    machines: BridgedMachines | None = None
    other_node: OtherNode | None = None
    left: list[str] = field(default_factory=list)
    #: Whether the scenario killed the kernel (its leftovers are then the next launch's to
    #: sweep: a killed kernel removes nothing).
    killed: bool = False
    #: Where the kernel's machine's file system is seen from here ("": this one's).
    root: str = ""

    def place(self, folder: Path) -> Path:
        """Where a scenario given ``folder`` runs: there, or, where the ranks run on hosts
        (which reach only this session's folder), a folder of the same name in this one."""
        if self.machines is None or self.folder in folder.parents:
            return folder
        placed = self.folder / folder.name
        placed.mkdir()
        return placed


class HeldKernel:
    """A kernel session held open across scenarios until :meth:`close`."""

    def __init__(self) -> None:
        self._open: contextlib.ExitStack | None = None
        #: The session held now (``None``: none).
        self.session: KernelSession | None = None

    def hold(self, started: contextlib.AbstractContextManager[KernelSession]) -> KernelSession:
        """Enter ``started`` (a :func:`kernel_session`) and hold it."""
        self.close()
        self._open = contextlib.ExitStack()
        self.session = self._open.enter_context(started)
        return self.session

    def close(self) -> list[str]:
        """Shut the held kernel down; what it left."""
        session, opened = self.session, self._open
        self.session = self._open = None
        if opened is None or session is None:
            return []
        opened.close()
        return session.left


class StyleKernels:
    """The kernel the current style's scenarios share; a new one for the next style, or after
    a scenario broke an invariant (what broke may spoil the next). ``make_folder(name)`` makes
    a new folder for each kernel."""

    def __init__(self, make_folder: Callable[[str], Path]) -> None:
        self._make_folder = make_folder
        self._style = ""
        self._held = HeldKernel()

    def session(self, scenario: Scenario) -> KernelSession | None:
        """The kernel for ``scenario`` (``None``: it needs one of its own, which it kills)."""
        if scenario.fault in OWN_KERNEL:
            return None
        if self._held.session is None or self._style != scenario.style:
            folder = self._make_folder(f"kernel-{scenario.style}")
            self._held.hold(kernel_session(folder, scenario.style))
            self._style = scenario.style
        return self._held.session

    def close(self) -> list[str]:
        """Shut the kernel down; what it left."""
        return self._held.close()


@contextmanager
def kernel_session(
    folder: Path, style: str = "", small_shm: bool = False, cluster: RayCluster | None = None
) -> Iterator[KernelSession]:
    """A set-up kernel under ``folder`` while the block runs (for a host ``style``, with its
    hosts; with ``small_shm``, a small ``/dev/shm`` of its own; for the ``ray`` style, on the
    head node of ``cluster``, under whose folder ``folder`` must be); its leftovers said once
    it shut down (a kernel the block killed leaves nothing to say, but on the hosts)."""
    root = cluster.head_root() if cluster is not None else ""
    shm_before = _shm(root)
    scratch = folder / "scratch"
    scratch.mkdir()
    with contextlib.ExitStack() as machinery:
        setup = CONFIG.format(config=str(folder / "config.json"), timeout=TIMEOUT_S) + FUNCTIONS

        def cleanup(step: Callable[[], None]) -> None:
            machinery.callback(step)

        machines, options, env = _machines(style, folder, cleanup, cluster)
        if machines is not None:
            setup += HOSTS.format(hosts=options)
        other = (
            OtherNode(machines, options, folder, cleanup) if style == "nodes" and machines else None
        )
        wrap = SMALL_SHM if small_shm else None
        address = None
        if cluster is not None:  # the kernel in the head's namespaces, at the head's address
            wrap, address = cluster.on_head([]), cluster.head.address
            setup += RAY_CONNECTED
        with running_kernel(folder, scratch, env, wrap, address) as (manager, client):
            kernel = _kernel_process(manager)
            session = KernelSession(manager, client, kernel, folder, machines, other, root=root)
            ready, _ = _run(client, setup + LIFELONG)
            assert ready.status == "ok", ready
            if address is not None:  # interrupted by message: its control thread says so
                _ask_on_control(client)
            own_pid = _pid_inside(kernel.pid)
            yield session
            killed = session.killed or not manager.is_alive()  # the kill may be on its way
        if not killed:  # the kernel's own go at exit
            session.left = _files_left(folder, shm_before, own_pid, root)
        if machines is not None:
            session.left += _left_on_hosts(machines)


def _ask_on_control(client: BlockingKernelClient) -> None:
    """Ask the kernel something on its control channel, and wait for the answer: ipykernel's
    control thread says it is busy, then idle (its first words make it an event pipe, a socket
    and an eventfd, kept for the kernel's life), as for each interrupt sent by message."""
    request = client.session.msg("kernel_info_request")
    client.control_channel.send(request)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            reply = client.control_channel.get_msg(timeout=1)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
            return
    raise TimeoutError("the kernel did not answer on its control channel")


def _machines(
    style: str,
    folder: Path,
    cleanup: Callable[[Callable[[], None]], None],
    cluster: RayCluster | None = None,
) -> tuple[BridgedMachines | None, dict[str, object], dict[str, str]]:
    """The machines a host ``style`` runs on (torn down by ``cleanup``, after the kernel; the
    ``ray`` style's are ``cluster``, the lane's), the launch's options that name them, and what
    the kernel's environment needs for them."""
    if style == "ray":
        assert cluster is not None, "the ray style runs on the Ray lane's cluster"
        return cluster, {"hosts": "ray"}, {}
    if style == "ssh":
        require_ssh_machines()
        hosts = SshMachines(folder, cleanup)
        names = [host.name for host in hosts.hosts]
        return hosts, {"hosts": names, "ssh_config": str(hosts.ssh_config)}, {}
    if style == "slurm":  # the kernel runs inside an allocation of both nodes
        require_slurm_cluster()
        cluster = SlurmCluster(folder, cleanup)
        return cluster, {"hosts": "slurm"}, cluster.allocation()
    if style == "nodes":  # the kernel is node 0 and hosts the rendezvous; node 1 a machine
        require([], [])  # root, ip, unshare
        machines = BridgedMachines(folder, cleanup, count=1)
        endpoint = f"{machines.kernel_address}:{free_port(machines.kernel_address)}"
        return machines, {"num_nodes": 2, "node_rank": 0, "rdzv_endpoint": endpoint}, {}
    return None, {}, {}


def run_scenario(
    scenario: Scenario,
    folder: Path,
    session: KernelSession | None = None,
    cluster: RayCluster | None = None,
) -> Outcome:
    """Run ``scenario`` under ``folder``, in ``session`` or a fresh kernel of its own (and
    then what the kernel left once shut down counts too; the ``ray`` style's on ``cluster``);
    what it broke."""
    if session is not None:
        return _run_scenario(scenario, session.place(folder), session)
    small_shm = scenario.fault == "shm-full"
    started = time.monotonic()
    with kernel_session(folder, scenario.style, small_shm, cluster) as own:
        outcome = _run_scenario(scenario, folder, own)
        played = sum(outcome.phases.values())
    outcome.phases["own kernel"] = time.monotonic() - started - played
    for left in own.left:
        outcome.fail("nothing left", left)
    return outcome


def _run_scenario(scenario: Scenario, folder: Path, session: KernelSession) -> Outcome:
    outcome = Outcome(scenario)
    marks, checkpoints = folder / "marks", folder / "checkpoints"
    marks.mkdir()
    checkpoints.mkdir()
    disk = small_disk(checkpoints, DISK_BYTES) if scenario.fault == "disk-full" else nullcontext()
    with disk:
        _play(outcome, marks, checkpoints, session)
    return outcome


def _play(outcome: Outcome, marks: Path, checkpoints: Path, session: KernelSession) -> None:
    """The scenario of ``outcome`` in ``session``: its fault, the next run, the checks."""
    scenario, folder = outcome.scenario, marks.parent
    manager, client, kernel = session.manager, session.client, session.kernel
    with outcome.timed("set-up"):
        _set_up(scenario.style, session, folder, checkpoints)
        threads_before, descriptors_before = _threads(client), _descriptors(client, kernel)
    plan = plan_of(scenario, str(marks), str(checkpoints))
    marker = marks / f"step-{scenario.rank}-{scenario.step}-0"  # the first attempt's
    action: Callable[[], None] | None = None
    at: Path | None = marker
    machines = session.machines
    if scenario.fault == "interrupt":
        action = manager.interrupt_kernel
        at = {
            "start-up": marks / "launching",
            "mid-run": marker,
            "teardown": marks / f"end-{scenario.rank}",
        }[scenario.moment]
    elif scenario.fault == "kernel-killed":
        action = lambda: _kill(kernel)  # noqa: E731
    elif scenario.fault == "link-cut":
        assert machines is not None, scenario
        action = lambda: _cut(machines, scenario.rank, marks)  # noqa: E731
    code = fault_cell(scenario, plan)
    if scenario.fault == "shm-full":  # filled before the run: every big value meets it full
        code = FILL_SHM.format(filler=SHM_FILLER) + code
    other = session.other_node
    try:
        # interrupted as it starts, node 0 may never reach the rendezvous: node 1 waits for it
        starting = scenario.fault == "interrupt" and scenario.moment == "start-up"
        with (
            outcome.timed("fault run"),
            other.running(plan, may_wait=starting) if other else nullcontext(),
        ):
            end, seen_at = _run(
                client,
                code,
                manager,
                at,
                action,
                scenario.answer_after,
                kills=scenario.fault == "kernel-killed",
            )
    finally:
        if scenario.fault == "link-cut" and machines is not None:  # the user mends it
            machines.mend(_cut_host(machines, scenario.rank))
    if other is not None and other.trouble:
        hung = "no orphans" if scenario.fault == "kernel-killed" else "ends in time"
        outcome.fail(hung, other.trouble)
    if scenario.fault == "kernel-killed":
        assert seen_at is not None, f"the kernel was never killed: the cell ended {end}"
        session.killed = True
        _check_orphans(outcome, marks, machines)
        return
    if seen_at is None and marker.exists():
        seen_at = marker.stat().st_mtime - time.time() + time.monotonic()
    Path(str(plan["filler"])).unlink(missing_ok=True)  # the user frees the space
    Path(f"/proc/{kernel.pid}/root{SHM_FILLER}").unlink(missing_ok=True)  # in its /dev/shm
    # the clean run checkpoints where the scenario's did: its checkpoints are the reference
    clean_plan = plan_of(None, str(marks), str(checkpoints / "clean"), bool(plan["checkpoint"]))
    follow_started = time.monotonic()
    with outcome.timed("next run"), other.running(clean_plan) if other else nullcontext():
        follow, _ = _run(client, follow_up_cell(scenario.style, clean_plan), manager)
    if other is not None and other.trouble:
        outcome.fail("next run works", other.trouble)
    # a run that restarts runs once more, whole, after the fault
    again = follow.ended_at - follow_started if scenario.style == "restarts" else 0.0
    _check_end(outcome, end, seen_at, again)
    _check_fault(outcome, end, machines)
    if scenario.style == "cell" and follow.status == "ok":  # the values -o stored
        shown, _ = _run(client, "print(chaos_result)", manager)
        follow.stdout += shown.stdout
    _check_follow_up(outcome, end, follow)
    with outcome.timed("stop"):
        stopped, _ = _run(client, "from nb_accel import stop_workers\nstop_workers()", manager)
    if stopped.status != "ok":
        outcome.fail("nothing left", f"stop_workers(): {stopped.ename}: {stopped.evalue}")
    if isinstance(machines, RayCluster):
        held, _ = _run(client, RAY_GROUPS_HELD, manager)
        if held.stdout.strip() != "[]":
            outcome.fail("nothing left", f"Ray placement groups: {held.stdout.strip()}")
    with outcome.timed("checks"):
        _check_checkpoints(outcome, checkpoints, checkpoints / "clean")
        _check_nothing_left(outcome, kernel, threads_before, _threads(client))
        if machines is not None:
            for left in _left_on_hosts(machines):
                outcome.fail("nothing left", left)
        settled = _settled(client, kernel, descriptors_before)
        _check_descriptors(outcome, descriptors_before, settled, kernel.pid)


def _set_up(style: str, session: KernelSession, folder: Path, checkpoints: Path) -> None:
    """What the style does before its fault's run: a ``cell`` scenario starts its pool, a
    ``warm`` one warms its workers."""
    client, manager = session.client, session.manager
    if style == "cell":
        started, _ = _run(client, f"%%distributed -n {RANKS}\n{FUNCTIONS}\nkept = rank")
        assert started.status == "ok", started
    if style == "warm":  # the workers are warm when the fault strikes
        clean = plan_of(None, str(folder / "warm-up"), str(checkpoints / "warm-up"))
        (folder / "warm-up").mkdir()
        warmed, _ = _run(client, follow_up_cell("warm", clean), manager)
        assert warmed.status == "ok", warmed


def bound_of(fault: str) -> float:
    """How long after ``fault`` its cell may take to end: a rank that waits (frozen, stuck)
    is given up at the collective timeout, a flood of output takes its time to arrive; any
    other fault ends the cell at once."""
    if fault == "interrupt":
        return INTERRUPT_BOUND_S
    return TIMEOUT_S + END_MARGIN_S if fault in WAITS + SLOWED else FAULT_BOUND_S


def _check_end(outcome: Outcome, end: CellEnd, seen_at: float | None, again: float) -> None:
    scenario = outcome.scenario
    if end.capped or end.status == "hung":
        outcome.fail("ends in time", f"the cell did not end within {CELL_CAP_S:.0f} s")
        return
    if seen_at is None:
        return
    took = end.ended_at - seen_at
    outcome.seconds_to_end = took
    bound = bound_of(scenario.fault) + again
    if took > bound:
        said = f"{end.ename}: {end.evalue}" if end.ename else end.status
        if end.traceback:  # the error's last lines and notes (where the ranks were said to be)
            said += "\n" + _last_frames(end.traceback, 8)
        outcome.fail(
            "ends in time", f"{took:.1f} s after the fault (bound {bound:.0f} s), ending {said}"
        )


def _check_fault(outcome: Outcome, end: CellEnd, machines: BridgedMachines | None = None) -> None:
    scenario = outcome.scenario
    if scenario.style in AGENT_STYLES and scenario.fault == "shm-full":  # see SHM_LIMIT
        if end.ename != "LaunchError" or SHM_LIMIT not in end.evalue:
            outcome.fail("names the fault", f"{end.status} {end.ename}: {end.evalue}")
        return
    if scenario.style == "restarts" and scenario.fault not in ("interrupt",):
        if end.status != "ok":
            outcome.fail("resumes exactly", f"{end.ename}: {end.evalue}")
        return
    if scenario.fault == "interrupt":
        if end.status == "error" and end.ename != "KeyboardInterrupt":
            where = _last_frames(end.traceback)
            outcome.fail("names the fault", f"interrupted: {end.ename}: {end.evalue}\n{where}")
        return
    if scenario.fault == "print-flood" and _flood_outlasted_the_timeout(scenario, end):
        return  # the other rank rightly gave up on it, and says it was late, not absent
    if scenario.fault in ("print-flood", "shm-full"):  # nothing fails: it all goes through
        if end.status != "ok":
            outcome.fail("names the fault", f"{scenario.fault} ended in {end.ename}: {end.evalue}")
        return
    _expect_error(outcome, end, machines)


def _flood_outlasted_the_timeout(scenario: Scenario, end: CellEnd) -> bool:
    """Whether a flooding rank's cell ended in the other rank's collective timeout, the
    flooding rank named as still running then, or as reaching its collective after the others
    gave up (on a loaded machine its output can take longer than the timeout to drain): its
    lateness said, never that it had returned before. A flooding rank on the ``nodes`` style's
    node 1 is said to be there (node 0's kernel does not see it; node 1's launch says where);
    one on node 0 that came once node 1 had gone, with the timeout it left, finds its
    connections closed as it comes, node 1 having ended the launch first."""
    said = end.evalue
    late = ("was still running", RETURNED_LATER, CAME_LATE)
    if scenario.style == "nodes":
        late += (f"is on node {scenario.rank}, whose own launch says where it was",)
        left = f"rank {scenario.rank}'s connections to another node's ranks were closed as it came"
        if end.ename == "LaunchError" and said.startswith(left):
            return True  # node 1 gone with the timeout it recorded: all node 0 can know
    return (
        end.ename == "CollectiveTimeoutError"
        and f"Rank {scenario.rank} did not arrive (" in said
        and any(f"did not arrive ({words}" in said for words in late)
    )


def _check_follow_up(outcome: Outcome, end: CellEnd, follow: CellEnd) -> None:
    scenario = outcome.scenario
    if follow.status != "ok":
        outcome.fail("next run works", f"{follow.ename}: {follow.evalue}")
        return
    results = _results(follow)
    if scenario.style == "cell":
        cell_results = _cell_results(follow)
        if cell_results is None:
            outcome.fail("next run works", f"no results: {follow.stdout!r}")
            return
        kept = [held for held, _ in cell_results]
        dies = ("sigkill", "sigstop", "killed-in-save")
        replaced = {scenario.rank} if scenario.fault in dies else set()
        wrong = [r for r, held in enumerate(kept) if held != (r not in replaced)]
        if wrong:
            outcome.fail("pool keeps namespaces", f"'kept' held per rank: {kept}")
        return
    # every rank's result; a node's launch returns its own ranks' (the kernel's: rank 0's)
    expected = 1 if scenario.style == "nodes" else RANKS
    if not isinstance(results, list) or len(results) != expected or results[0] != results[-1]:
        outcome.fail("next run works", f"results {follow.stdout[-500:]!r}")
        return
    if scenario.style == "restarts" and scenario.fault != "interrupt" and end.status == "ok":
        resumed = _results(end)
        if resumed != results:
            outcome.fail("resumes exactly", f"resumed {resumed} but a clean run gives {results}")


def _cell_results(follow: CellEnd) -> list[tuple[bool, list[float]]] | None:
    """A pool's follow-up values (``print(chaos_result)`` after the cell), one per rank."""
    results = _results(follow)
    return results if isinstance(results, list) and len(results) == RANKS else None


#: Lists the kernel's threads but pyzmq's own (its garbage collector starts with big messages).
THREADS = (
    "import threading as _threading\n"
    "print(sorted(f'{t.name} ({t.ident})' for t in _threading.enumerate() "
    "if not type(t).__module__.startswith('zmq')))"
)


def _threads(client: BlockingKernelClient) -> list[str]:
    """The kernel's threads (pyzmq's left out), by name and ident."""
    import ast

    listed, _ = _run(client, THREADS)
    return list(ast.literal_eval(listed.stdout.strip() or "[]"))


def _check_nothing_left(
    outcome: Outcome, kernel: psutil.Process, threads_before: list[str], threads: list[str]
) -> None:
    deadline = time.monotonic() + 10
    while kernel.children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [_told(p.pid) for p in kernel.children(recursive=True)]
    if left:
        outcome.fail("nothing left", f"processes of the kernel: {', '.join(left)}")
    new_threads = sorted(set(threads) - set(threads_before))
    if new_threads:
        outcome.fail("nothing left", f"the kernel's threads: {new_threads} new")


def _files_left(folder: Path, shm: set[str], kernel: int, root: str = "") -> list[str]:
    """What kernel ``kernel`` (its pid in its own namespace) left: its ``/dev/shm`` folders (not
    in ``shm`` before it; on the machine at ``root``), files in its scratch folder
    (``folder/scratch``) but what others keep there on purpose."""
    left = []
    new_shm = sorted(name for name in _shm(root) - shm if f"-{kernel}-" in name)  # its folders
    if new_shm:
        left.append(f"/dev/shm: {new_shm}")
    scratch = [p.name for p in (folder / "scratch").iterdir() if not p.name.startswith(OTHERS)]
    if scratch:
        left.append(f"scratch: {scratch}")
    return left


def _left_on_hosts(machines: BridgedMachines) -> list[str]:
    """What still runs on the hosts once what ends on its own had its time (nothing: [])."""
    machines.settle(ORPHAN_WAIT_S)
    left = machines.processes()
    return [f"on the hosts: {left}"] if left else []


def _check_orphans(outcome: Outcome, marks: Path, machines: BridgedMachines | None) -> None:
    if machines is not None:
        for left in _left_on_hosts(machines):
            outcome.fail("no orphans", left)
    if machines is not None and machines.own_pids:  # the pids the workers wrote are theirs
        return
    pids = _worker_pids(marks)
    deadline = time.monotonic() + ORPHAN_WAIT_S
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in pids if psutil.pid_exists(pid) and _running(pid)}
        time.sleep(0.05)
    if alive:
        told = ", ".join(_told(pid) for pid in sorted(alive))
        outcome.fail("no orphans", f"workers outlived their killed kernel: {told}")
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _told(pid: int) -> str:
    """``pid`` as a story: its parent, state, threads and command."""
    try:
        process = psutil.Process(pid)
        parent = process.parent()
        state = parent.status() if parent is not None else "gone"
        return (
            f"{pid} (parent {process.ppid()} {state}, {process.status()}, "
            f"{process.num_threads()} threads, {' '.join(process.cmdline()[:4])})"
        )
    except psutil.ZombieProcess:
        return f"{pid} (a zombie: it ended and was never reaped)"
    except psutil.Error:
        return str(pid)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


#: The checkpoint's description file: a folder without it never completed.
DESCRIPTION = "nb_accel_checkpoint.json"
#: A checkpoint's files that differ between two runs of the same training: each process's
#: random generators (Python's is seeded afresh in each process).
RUN_OWN = ("random_states_",)


def _numbered(project: Path) -> dict[str, Path]:
    folder = project / "checkpoints"
    if not folder.is_dir():
        return {}
    return {p.name: p for p in folder.iterdir() if p.name.startswith("checkpoint_")}


def _check_checkpoints(outcome: Outcome, project: Path, clean_project: Path) -> None:
    """Every checkpoint the scenario's run left is whole: it has its description file, and the
    files (and bytes) the clean run's checkpoint of the same number has."""
    faulty, clean = _numbered(project), _numbered(clean_project)
    names = {p.name for p in next(iter(clean.values())).iterdir()} if clean else set()
    for number, folder in sorted(faulty.items()):
        held = {p.name for p in folder.iterdir()}
        if DESCRIPTION not in held or (names and held != names):
            outcome.fail("checkpoints whole", f"{number} holds {sorted(held)}, not {sorted(names)}")
            return
        twin = clean.get(number)
        if twin is None:
            continue
        same = [n for n in sorted(names) if not n.startswith(RUN_OWN)]
        differ = [n for n in same if (folder / n).read_bytes() != (twin / n).read_bytes()]
        if differ:
            outcome.fail("checkpoints whole", f"{number}'s {differ} differ from a clean run's")
            return


#: What the kernel holds for its life from its first use, made before the scenario's baseline:
#: torch's store library keeps a pipe from its first store on; pyzmq starts its garbage
#: collector (a thread, its sockets and their eventfds) with the first big message it sends.
#: And ``torch._dynamo``, which every rank's DDP would import on every launch (1.2 s each):
#: imported here once, the forked ranks share it.
LIFELONG = """
import torch._dynamo
import torch.distributed as _dist
_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print("x" * 100_000)
"""
#: The ``ray`` style's kernel connects to its cluster once, as a notebook on the head node does,
#: and has an actor answer once: the actor's worker connects back to the kernel (its owner),
#: a connection Ray keeps (Ray's threads and connections are the kernel's for its life).
RAY_CONNECTED = """
import ray
ray.init(address="auto", logging_level="WARNING", log_to_driver=False)
@ray.remote(num_cpus=0)
class _Answers:
    def answer(self):
        return None
_answering = _Answers.remote()
ray.get(_answering.answer.remote())
ray.kill(_answering)
del _answering
"""
#: Lists the cluster's placement groups that hold resources still (the ``ray`` style's).
RAY_GROUPS_HELD = (
    "print(sorted(group['placement_group_id'] for group in "
    "ray.util.placement_group_table().values() if group['state'] != 'REMOVED'))"
)
#: ipykernel's own housekeeping, done now: it closes the event pipe of each thread that has
#: ended (a socket and its eventfd) every 10 s (ipykernel 7; earlier, when the thread goes).
EVENT_PIPES_CLOSED = """
import sys as _sys
_collect = getattr(getattr(_sys.stdout, "pub_thread", None), "_event_pipe_gc", None)
if _collect is not None:
    try:
        _collect().send(None)
    except StopIteration:
        pass
"""


def _descriptors(client: BlockingKernelClient, kernel: psutil.Process) -> dict[int, str]:
    """The kernel's open descriptors, each with what it is (a file, a socket, a pipe), once
    ipykernel has closed the event pipes of ended threads."""
    _run(client, EVENT_PIPES_CLOSED)
    found: dict[int, str] = {}
    for entry in Path(f"/proc/{kernel.pid}/fd").iterdir():
        try:
            found[int(entry.name)] = os.readlink(entry)
        except OSError:
            continue
    return found


def _last_frames(traceback: str, lines: int = 12) -> str:
    """The last ``lines`` lines of a cell's ``traceback``, without its colours: where an
    unexpected error came from."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", traceback).strip().splitlines()
    return "\n".join(plain[-lines:])


def _new(before: dict[int, str], after: dict[int, str]) -> dict[int, str]:
    return {fd: what for fd, what in after.items() if before.get(fd) != what}


def _settled(
    client: BlockingKernelClient, kernel: psutil.Process, before: dict[int, str]
) -> dict[int, str]:
    """The kernel's descriptors (see :func:`_descriptors`) once those closing on their way
    out have closed (a thread's, a store's, ending as the launch ends), up to
    :data:`DESCRIPTORS_SETTLE_S`: what is still new then was left."""
    deadline = time.monotonic() + DESCRIPTORS_SETTLE_S
    while True:
        after = _descriptors(client, kernel)
        if not _new(before, after) or time.monotonic() > deadline:
            return after
        time.sleep(0.1)  # polling the kernel's descriptors, not ordering events


def _check_descriptors(
    outcome: Outcome, before: dict[int, str], after: dict[int, str], kernel: int
) -> None:
    new = {fd: _socket_of(kernel, what) for fd, what in _new(before, after).items()}
    if new:
        outcome.fail("nothing left", f"the kernel's descriptors: {new} new")


def _socket_of(pid: int, what: str) -> str:
    """``what`` a descriptor of process ``pid`` is, with its ends where it is a socket (its
    line in the process's ``/proc/net`` tables): whose socket was left."""
    found = re.fullmatch(r"socket:\[(\d+)\]", what)
    if found is None:
        return what
    for table in ("unix", "tcp", "tcp6", "udp"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            inode = fields[6] if table == "unix" else fields[9] if len(fields) > 9 else ""
            if inode == found.group(1):
                return f"{what} {table}: {' '.join(fields[1:8] if table != 'unix' else fields[1:])}"
    return what
