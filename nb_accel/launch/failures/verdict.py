"""Turning the failure records of a worker group into the one exception the kernel raises."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..._messages import Failure
from ...errors import (
    CollectiveTimeoutError,
    RemoteTraceback,
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
    is_peer_loss,
)
from ...worker.transfer.pickling import loads

__all__ = [
    "failure_from_event",
    "died_failure",
    "frozen_failure",
    "watchdog_words",
    "is_watchdog_timeout",
    "looks_like_consequence",
    "Verdict",
    "judge",
    "rank_list",
    "build_exception",
]


def failure_from_event(event: Failure) -> tuple[WorkerFailure, bool]:
    """A :class:`WorkerFailure` from a worker's event (exception loaded if possible), and
    whether it was a collective timeout."""
    exception: BaseException | None = None
    if event.data is not None:
        try:
            loaded = loads(event.data)
            exception = loaded if isinstance(loaded, BaseException) else None
        except Exception:  # noqa: BLE001 - a broken exception object is still reported
            exception = None
    return WorkerFailure(
        rank=event.rank,
        type_name=event.type_name,
        message=event.message,
        traceback=event.traceback,
        exception=exception,
        host=event.host or None,
        timeout_s=event.timeout_s,
        collective=event.collective or None,
        at_prompt=event.at_prompt,
        signal_name=event.signal_name or None,
        exitcode=event.exitcode,
    ), event.is_timeout


#: What NCCL's watchdog writes to stderr before it aborts its process: a collective that timed
#: out; any error that ended the watchdog (the text after the marker says which); the watchdog
#: itself stuck (its heartbeat monitor). The first found names the reason.
WATCHDOG_TIMEOUT = "Watchdog caught collective operation timeout"
_WATCHDOG_ERROR = "watchdog thread terminated with exception:"
_WATCHDOG_STUCK = "watchdog got stuck for"
#: The ``type_name`` of a record for a worker that NCCL's watchdog aborted.
WATCHDOG = "watchdog"


def watchdog_words(last_words: str) -> str | None:
    """NCCL's watchdog's reason for aborting the process, found in the end of its stderr
    (``None`` when the watchdog said nothing)."""
    lines = last_words.splitlines()
    for marker, keep_marker in (
        (WATCHDOG_TIMEOUT, True),
        (_WATCHDOG_ERROR, False),
        (_WATCHDOG_STUCK, True),
    ):
        for line in reversed(lines):
            at = line.lower().find(marker.lower())
            if at >= 0:
                words = line[at:] if keep_marker else line[at + len(marker) :]
                return words.strip() or line.strip()
    return None


def is_watchdog_timeout(record: WorkerFailure) -> bool:
    """True for a worker that NCCL's watchdog aborted because a collective timed out."""
    return record.type_name == WATCHDOG and WATCHDOG_TIMEOUT.lower() in record.message.lower()


def _watchdog_failure(rank: int, pid: int, exitcode: int, last_words: str) -> WorkerFailure | None:
    words = watchdog_words(last_words)
    if words is None:
        return None
    message = f"NCCL's watchdog stopped rank {rank} (pid {pid}, SIGABRT): {words}"
    return WorkerFailure(rank, WATCHDOG, message, "", signal_name="SIGABRT", exitcode=exitcode)


#: What a ``SIGKILL`` is said to be, by whether the out-of-memory killer's count of kills on
#: the worker's machine rose while it ran (``None``: unknown, a guess is said).
SIGKILL_HINTS: dict[bool | None, str] = {
    True: (
        " (the out-of-memory killer: this machine's count of out-of-memory kills rose while "
        "it ran; use smaller batches, fewer ranks or fewer DataLoader workers)"
    ),
    False: (
        " (not by the out-of-memory killer, whose count of kills did not change: something "
        "sent it SIGKILL, such as `kill -9` or a job scheduler)"
    ),
    None: (
        " (perhaps the out-of-memory killer, a guess: `dmesg` on its machine says; else "
        "something sent it SIGKILL, such as `kill -9` or a job scheduler)"
    ),
}


def died_failure(
    rank: int,
    pid: int,
    exitcode: int | None,
    last_words: str = "",
    host: str | None = None,
    oom_killed: bool | None = None,
) -> WorkerFailure:
    """The record for a worker that ended without reporting.

    ``last_words``: the end of what it wrote to its stderr; a worker that NCCL's watchdog
    aborted is recorded with the watchdog's reason (:func:`is_watchdog_timeout` tells a
    collective's timeout). ``host``: the machine it ran on, in a launch across hosts.
    ``oom_killed``: whether the out-of-memory killer killed a process on its machine while
    it ran (:func:`~nb_accel.launch.failures.oom.oom_verdict`; ``None``: unknown), which
    tells what a ``SIGKILL`` was.
    """
    on = f" on {host}" if host else ""
    record = _died(rank, pid, exitcode, last_words, on, oom_killed)
    return dataclasses.replace(record, host=host) if host else record


def frozen_failure(rank: int, pid: int) -> WorkerFailure:
    """The record for a rank the kernel ended because its process was stopped (frozen) while
    the others waited for it."""
    message = (
        f"worker for rank {rank} (pid {pid}) was frozen (stopped by SIGSTOP, Ctrl-Z or a "
        "debugger holding it) while the other ranks waited for it, and was ended"
    )
    return WorkerFailure(rank, "signal", message, "", signal_name="SIGSTOP", exitcode=-9)


def _died(
    rank: int, pid: int, exitcode: int | None, last_words: str, on: str, oom_killed: bool | None
) -> WorkerFailure:
    if exitcode is not None and exitcode < 0:
        if -exitcode == signal.SIGABRT and last_words:
            record = _watchdog_failure(rank, pid, exitcode, last_words)
            if record is not None:
                return record
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = {
            "SIGKILL": SIGKILL_HINTS[oom_killed],
            "SIGSEGV": " (a crash in native code)",
            "SIGBUS": " (often a full /dev/shm: use fewer DataLoader workers)",
        }.get(name, "")
        message = f"worker for rank {rank} (pid {pid}{on}) was killed by {name}{hint}"
        return WorkerFailure(rank, "signal", message, "", signal_name=name, exitcode=exitcode)
    message = (
        f"worker for rank {rank} (pid {pid}{on}) exited with code {exitcode} without reporting "
        "a result (os._exit() or a crash in native code?)"
    )
    return WorkerFailure(rank, "exit", message, "", exitcode=exitcode)


def looks_like_consequence(failure: WorkerFailure, is_timeout: bool) -> bool:
    """True for errors that usually follow another rank's failure rather than cause it: a
    collective that timed out, or a connection a peer closed by going away."""
    return is_timeout or is_peer_loss(failure.message)


@dataclass(frozen=True)
class Verdict:
    """The failures of a launch, sorted: the root cause (one error, on one or more ranks),
    the knock-on failures it caused, and other independent failures (grouped by error)."""

    root: list[WorkerFailure]
    consequences: list[WorkerFailure]
    others: list[list[WorkerFailure]]
    timed_out: bool = False

    @property
    def root_ranks(self) -> list[int]:
        """The ranks the root cause was raised on."""
        return sorted(f.rank for f in self.root)

    def stop_reason(self) -> str:
        """What a knock-on failure's rank is shown as stopped by (``"rank 1 failed"``)."""
        return f"{rank_list(self.root_ranks)} failed"


def judge(ordered: Sequence[WorkerFailure], timeout_ranks: set[int]) -> Verdict:
    """Sort ``ordered`` (arrival order) into root cause, consequences and other failures.

    A worker killed by a signal comes first (every other error can follow from it; an abort by
    NCCL's watchdog is judged by the watchdog's words instead, like an exception); then the
    first error that does not look like a consequence; when every error looks like one, the
    first collective timeout (a lost connection follows from a rank that gave up waiting, not
    the other way round), else the first to arrive (a real network problem).
    """
    deaths = [f for f in ordered if f.type_name == "signal"]
    causes = [f for f in ordered if not looks_like_consequence(f, f.rank in timeout_ranks)]
    timeouts = [f for f in ordered if f.rank in timeout_ranks]
    first = (deaths or causes or timeouts or list(ordered))[0]
    groups = _group(list(ordered))
    if not deaths and not causes and first in timeouts:  # one event, wherever each waited
        root = timeouts
        groups = [rest for g in groups if (rest := [f for f in g if f not in root])]
    else:
        root = next(g for g in groups if first in g)
    if not deaths and not causes:  # every error looks like a consequence of another
        timed_out = first.rank in timeout_ranks
        return Verdict(root, [], [g for g in groups if g is not root], timed_out)
    consequences = [
        f for f in ordered if f not in root and f.type_name != "signal" and f not in causes
    ]
    others = [[f for f in g if f not in consequences] for g in groups if g is not root]
    return Verdict(root, consequences, [g for g in others if g])


def rank_list(ranks: Iterable[int]) -> str:
    """Rank numbers in order, three or more in a row joined: ``"rank 3"``, ``"ranks 2, 3"``,
    ``"ranks 0, 2-5, 9"``."""
    numbers = sorted(ranks)
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    parts = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in runs]
    return f"rank{'s' if len(numbers) > 1 else ''} {', '.join(parts)}"


def _group(failures: list[WorkerFailure]) -> list[list[WorkerFailure]]:
    groups: list[list[WorkerFailure]] = []
    for failure in failures:
        for group in groups:
            if group[0].same_error_as(failure):
                group.append(failure)
                break
        else:
            groups.append([failure])
    return groups


def _others_summary(groups: list[list[WorkerFailure]]) -> str:
    lines = [f"  {rank_list([f.rank for f in g])}: {g[0].first_line}" for g in groups]
    return ("Other failures:\n" + "\n".join(lines)) if lines else ""


def _timeout_error(
    root: list[WorkerFailure], world_size: int, status: dict[int, str], timeout_s: float
) -> CollectiveTimeoutError:
    timed_out = sorted(f.rank for f in root)
    missing = [r for r in range(world_size) if r not in timed_out]
    detail = "; ".join(f"rank {r} {status.get(r, 'was still running')}" for r in missing)
    if len(missing) == 1:
        detail = status.get(missing[0], "was still running")
    absent = f" {rank_list(missing).capitalize()} did not arrive ({detail})." if missing else ""
    chosen = next((f.timeout_s for f in root if f.timeout_s is not None), None)
    seconds = timeout_s if chosen is None else chosen
    knob = "`timeout=`" if chosen is None else "the timeout of `InitProcessGroupKwargs`"
    message = (
        f"A collective timed out after {seconds:g} s on {rank_list(timed_out)} of {world_size}"
        f"{_inside(root)}."
        f"{absent} Make sure every rank calls the same collectives in the same order, or raise "
        f"{knob} if the work between two collectives legitimately takes longer."
    )
    for record in root:
        if record.type_name == WATCHDOG:  # the backend's own words name the collective
            message += "\n" + record.message
    return CollectiveTimeoutError(message, root)


def _inside(root: list[WorkerFailure]) -> str:
    """`` (in all_reduce #3)``: the collective the timed-out ranks were in, where known."""
    known = {f.rank: f.collective for f in root if f.collective}
    if not known:
        return ""
    if len(set(known.values())) == 1 and len(known) == len(root):
        return f" (in {next(iter(known.values()))})"
    return " (" + ", ".join(f"rank {r} in {c}" for r, c in sorted(known.items())) + ")"


def _decorate(
    error: BaseException, root: list[WorkerFailure], note: str, ordered: list[WorkerFailure]
) -> BaseException:
    """Attach the worker traceback (as the cause), the ranks (as a note) and every record."""
    ranks = [f.rank for f in root]
    if root[0].traceback:
        header = f"Traceback from {rank_list(ranks)} (worker side):\n"
        error.__cause__ = RemoteTraceback(header + root[0].traceback.rstrip())
    if hasattr(error, "add_note"):
        error.add_note(note)
    # The records of ``error`` itself leave it out: an exception holding itself through its
    # records would wait for the garbage collector, and its traceback's frames with it.
    records = [
        f if f.exception is not error else dataclasses.replace(f, exception=None) for f in ordered
    ]
    try:
        error.nb_accel_failures = records  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass
    return error


def build_exception(
    ordered: list[WorkerFailure],
    timeout_ranks: set[int],
    world_size: int,
    status: dict[int, str],
    timeout_s: float,
    stopped: Iterable[int] = (),
    kept: bool = False,
) -> BaseException:
    """Choose the root cause among ``ordered`` (arrival order) and build the exception to raise.

    Args:
        ordered: every failure record, first received first.
        timeout_ranks: ranks whose failure was a collective timeout.
        world_size: number of ranks in the launch.
        status: for ranks that did not fail, what they did ("had already returned", ...).
        timeout_s: the launch's collective timeout.
        stopped: ranks that ended because of the failure without an error of their own
            (named with the ranks whose errors were consequences).
        kept: whether the ranks outlive the failure (a pool's): those it stopped were only
            interrupted, and are said to keep their variables.
    """
    verdict = judge(ordered, timeout_ranks)
    root, first = verdict.root, verdict.root[0]
    ranks = verdict.root_ranks
    summary = _others_summary(verdict.others)
    if verdict.timed_out:
        return _timeout_error(root, world_size, status, timeout_s)
    knock_on = _knock_on(verdict, stopped, kept)
    if first.signal_name or first.type_name == "exit":  # a watchdog's abort too
        text = first.message + (f" (same on {rank_list(ranks)})" if len(ranks) > 1 else "")
        text += "".join("\n" + part for part in (knock_on, summary) if part)
        return WorkerDiedError(text, ordered)
    error: BaseException = first.exception or WorkerError(
        f"{first.first_line} (on {rank_list(ranks)}; the exception could not be "
        "moved to the kernel, so it is re-raised as WorkerError)",
        ordered,
    )
    note = f"Raised on {rank_list(ranks)} of {world_size}"
    note += f" (host {first.host})" if first.host else ""
    note += " (identical on each)" if len(ranks) > 1 else ""
    failed = {f.rank for f in ordered}
    bystanders = [f"rank {r} {status[r]}" for r in sorted(status) if r not in failed]
    if bystanders and looks_like_consequence(first, first.rank in timeout_ranks):
        note += "; " + ", ".join(bystanders) + " (every rank must call the same collectives)"
    for part in (knock_on, summary):
        if part:
            note += "\n" + part
    return _decorate(error, root, note, ordered)


def _knock_on(verdict: Verdict, stopped: Iterable[int] = (), kept: bool = False) -> str:
    """A line naming the ranks that stopped because of the root cause (their errors, a lost
    connection or a timeout, are not shown); ``kept``: their processes live on, only their
    work was interrupted."""
    failed_on_their_own = {f.rank for group in verdict.others for f in group}
    ranks = sorted(
        ({f.rank for f in verdict.consequences} | set(stopped))
        - set(verdict.root_ranks)
        - failed_on_their_own
    )
    if not ranks:
        return ""
    verb = "was" if len(ranks) == 1 else "were"
    if kept:
        their = "its" if len(ranks) == 1 else "their"
        return (
            f"{rank_list(ranks).capitalize()} {verb} interrupted by this failure "
            f"and kept {their} variables."
        )
    return f"{rank_list(ranks).capitalize()} {verb} stopped by this failure."
