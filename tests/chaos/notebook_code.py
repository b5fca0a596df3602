"""The notebook code of the chaos campaign's scenarios: the training function every style runs
(a few steps of a small model, checkpointed each step, resumed after a restart), the fault it
makes on one rank at one step, and the cells that run it in each style."""

from __future__ import annotations

from scenarios import HOST_STYLES, RANKS, STEPS, Scenario

__all__ = [
    "BIG_BYTES",
    "CONFIG",
    "DISK_BYTES",
    "FILL_SHM",
    "FUNCTIONS",
    "HOSTS",
    "HOST_MB_PRINTED",
    "MB_PRINTED",
    "SAVES",
    "SHM_BYTES",
    "SMALL_SHM",
    "TIMEOUT_S",
    "fault_cell",
    "follow_up_cell",
    "plan_of",
]

#: The collective timeout of every scenario's launch (and pool): longer than a fault that is
#: not a wait may take to end its cell (:data:`campaign.FAULT_BOUND_S`), so that a cell that
#: waits for the timeout instead is seen.
TIMEOUT_S = 4.0
#: The faults that strike in a checkpoint's save: every step of their run saves one.
SAVES = ("disk-full", "killed-in-save")
#: How big the checkpoints' file system is for a ``disk-full`` fault (a tmpfs).
DISK_BYTES = 4 << 20
#: What a flooding rank prints, in megabytes: on a host, less. There its output crosses the
#: host's node, its SSH or SLURM link and the kernel, all on this machine's two cores (about
#: 20 MB/s against 65 MB/s here), and 100 MB outlasts the scenarios' collective timeout: the
#: other rank's collective then rightly times out, naming the flooding rank as still running.
MB_PRINTED = 100
HOST_MB_PRINTED = 20
#: How big the values are that travel to and from the ranks with a full ``/dev/shm`` (above
#: the size that goes through it when there is room).
BIG_BYTES = 4 << 20
#: How big the kernel's own ``/dev/shm`` is for a ``shm-full`` fault (a tmpfs in a mount
#: namespace of its own), and the command that starts such a kernel.
SHM_BYTES = 64 << 20
SMALL_SHM = [
    *("unshare", "--mount", "--propagation", "private", "--", "sh", "-c"),
    f'mount -t tmpfs -o size={SHM_BYTES} chaos-shm /dev/shm && exec "$@"',
    "sh",
]
#: Fills the kernel's ``/dev/shm`` (``{filler}``: the file) before a ``shm-full`` fault's run.
FILL_SHM = "chaos_fill({filler!r})\n"

#: The kernel's saved configuration (``{config}``: its file): the pool's timeout, the CPU, and
#: no rank kept for ``%debug`` (nobody debugs here).
CONFIG = """
import os
from nb_accel.config import Config, save_config
os.environ["NB_ACCEL_CONFIG_FILE"] = {config!r}
save_config(Config(timeout={timeout}, cpu=True, post_mortem_wait=0), {config!r})
%load_ext nb_accel
"""

#: Defines ``chaos_train(plan)`` and what it needs (in the kernel, and in a pool's ranks).
FUNCTIONS = """
import os, pathlib, signal, sys, time
import torch
import torch.distributed as dist
from nb_accel import Accelerator, ProjectConfiguration, notebook_launcher

class ChaosProgress:
    def __init__(self):
        self.step = 0
    def state_dict(self):
        return {"step": self.step}
    def load_state_dict(self, state):
        self.step = state["step"]

def chaos_fill(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError:  # full
        pass
    finally:
        os.close(fd)

def chaos_strike(plan, rank):
    fault = plan["fault"]
    if fault == "raise":
        raise ValueError(f"chaos on rank {rank}")
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault in ("stuck-own", "kernel-killed"):  # the kernel is killed while this rank waits
        while True:
            time.sleep(0.05)
    if fault == "link-cut":  # goes on once its host is cut off, into the step's collectives
        while not os.path.exists(os.path.join(plan["marks"], "cut")):
            time.sleep(0.01)
    if fault == "stuck-collective":
        dist.recv(torch.zeros(1), src=1 - rank)  # nobody sends it
    if fault == "breakpoint-and-raise":
        breakpoint()
    if fault == "disk-full":  # the file system of the checkpoints is filled to the brim
        chaos_fill(plan["filler"])
    if fault == "killed-in-save":  # in save_state, once this rank's part is written
        os.environ["NB_ACCEL_TEST_CRASH_AT"] = "state-recorded" if rank == 0 else "state-written"
    if fault == "print-flood":
        line = "x" * 1023 + "\\n"
        for _ in range(plan["mb"] * 1024):
            sys.stdout.write(line)
        sys.stdout.flush()

def chaos_train(plan, big=None):
    project = ProjectConfiguration(
        project_dir=plan["checkpoints"], automatic_checkpoint_naming=True, total_limit=3
    )
    accelerator = Accelerator(cpu=True, project_config=project)
    rank = accelerator.process_index
    marks = pathlib.Path(plan["marks"])
    (marks / f"pid-{rank}-{os.getpid()}").touch()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    progress = ChaosProgress()
    accelerator.register_for_checkpointing(progress)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt > 0:
        pathlib.Path(plan["filler"]).unlink(missing_ok=True)  # the space is freed, then resumed
        accelerator.load_state()
    data = torch.arange(32.0).reshape(8, 4) / 32
    other = 1 - rank
    while progress.step < plan["steps"]:
        step = progress.step
        (marks / f"step-{rank}-{step}-{attempt}").touch()
        if attempt == 0 and step == plan["step"]:
            if rank == plan["rank"]:
                chaos_strike(plan, rank)
            elif plan["fault"] == "breakpoint-and-raise":
                raise ValueError(f"chaos on rank {rank}")
        loss = model(data[rank::2]).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        if plan["checkpoint"]:
            accelerator.save_state()
    (marks / f"end-{rank}").touch()
    weights = accelerator.unwrap_model(model).weight.flatten().tolist()  # exact: compared
    if plan["big"]:  # a big value back too (kept aside from the pickle where it fits)
        return weights, torch.full((plan["big"] // 4,), float(rank)) + (0 if big is None else big)
    return weights
"""


def plan_of(
    scenario: Scenario | None, marks: str, checkpoints: str, checkpoint: bool = False
) -> dict[str, object]:
    """What ``chaos_train`` is told: the fault (none for a clean run), where, and where to
    leave markers and checkpoints; a scenario's run checkpoints every step where its fault
    strikes in a save or its run resumes from them, a clean run where it is told to
    (``checkpoint``: its checkpoints are compared with the scenario's)."""
    return {
        "fault": scenario.fault if scenario else "none",
        "rank": scenario.rank if scenario else -1,
        "step": scenario.step if scenario else -1,
        "steps": STEPS,
        "marks": marks,
        "checkpoints": checkpoints,
        "checkpoint": checkpoint if scenario is None else _checkpoints(scenario),
        "filler": f"{checkpoints}/filler",
        "mb": HOST_MB_PRINTED if scenario and scenario.style in HOST_STYLES else MB_PRINTED,
        "big": BIG_BYTES if scenario is not None and scenario.fault == "shm-full" else 0,
    }


def _checkpoints(scenario: Scenario) -> bool:
    """Whether ``scenario``'s run checkpoints every step: its fault strikes in a save, or its
    run resumes from them."""
    return scenario.style == "restarts" or scenario.fault in SAVES


def _launch(style: str, plan: dict[str, object]) -> str:
    options = {
        "cold-fork": f'num_processes={RANKS}, start_method="fork"',
        "cold-spawn": f'num_processes={RANKS}, start_method="spawn"',
        "warm": f"num_processes={RANKS}, reuse_workers=True",
        "restarts": f"num_processes={RANKS}, max_restarts=1",
        "ssh": "num_processes=1, **CHAOS_HOSTS",  # one rank on each host
        "slurm": "num_processes=1, **CHAOS_HOSTS",
        "nodes": "num_processes=1, **CHAOS_HOSTS",  # node 0's rank; node 1 runs the other
        "ray": "num_processes=1, **CHAOS_HOSTS",  # a rank on each node of the cluster
    }[style]
    big = f" torch.ones({plan['big']} // 4)" if plan["big"] else ""  # there and back
    return (
        f"os.makedirs(os.path.join({plan['marks']!r}, 'launching'), exist_ok=True)\n"
        f"chaos_result = notebook_launcher(chaos_train, args=({plan!r},{big}), "
        f"timeout={TIMEOUT_S}, {options})\nprint(chaos_result)"
    )


def fault_cell(scenario: Scenario, plan: dict[str, object]) -> str:
    """The cell that runs ``scenario``'s fault."""
    if scenario.style == "cell":  # the start-up marker: the pool is already started
        return (
            f"%%distributed -o chaos_result\n"
            f"os.makedirs(os.path.join({plan['marks']!r}, 'launching'), exist_ok=True)"
            f"\nchaos_train({plan!r})"
        )
    return _launch(scenario.style, plan)


def follow_up_cell(style: str, plan: dict[str, object]) -> str:
    """A clean run in the same style after the scenario: it must work."""
    if style == "cell":  # the functions defined again: a replaced rank lacks them
        return (
            f"%%distributed -o chaos_result\nexec({FUNCTIONS!r})\n"
            f"('kept' in globals(), chaos_train({plan!r}))"
        )
    return _launch(style, plan)


#: Where a host style's launches run (``{hosts}``: the launch's options that say so; for the
#: ``nodes`` style, node 0's and the rendezvous'), defined in its kernel.
HOSTS = "CHAOS_HOSTS = {hosts!r}\n"
