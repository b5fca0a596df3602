"""Turning the failure records of a worker group into the one exception the kernel raises."""

from __future__ import annotations

import pickle
import signal
from collections.abc import Sequence

from .._messages import Failure
from ..errors import (
    CollectiveTimeoutError,
    RemoteTraceback,
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
)

__all__ = ["failure_from_event", "died_failure", "build_exception"]

_CONSEQUENCE_MARKERS = ("connection closed by peer", "connection reset", "broken pipe", "went away")


def failure_from_event(event: Failure) -> tuple[WorkerFailure, bool]:
    """A :class:`WorkerFailure` from a worker's event (exception loaded if possible), and
    whether it was a collective timeout."""
    exception: BaseException | None = None
    if event.data is not None:
        try:
            loaded = pickle.loads(event.data)
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
    ), event.is_timeout


def died_failure(rank: int, pid: int, exitcode: int | None) -> WorkerFailure:
    """The record for a worker that ended without reporting."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = {
            "SIGKILL": " (often the out-of-memory killer: check `dmesg`, or use smaller batches)",
            "SIGSEGV": " (a crash in native code)",
            "SIGBUS": " (often a full /dev/shm: use fewer DataLoader workers)",
        }.get(name, "")
        message = f"worker for rank {rank} (pid {pid}) was killed by {name}{hint}"
        return WorkerFailure(rank, "signal", message, "", signal_name=name, exitcode=exitcode)
    message = (
        f"worker for rank {rank} (pid {pid}) exited with code {exitcode} without reporting "
        "a result (os._exit() or a crash in native code?)"
    )
    return WorkerFailure(rank, "exit", message, "", exitcode=exitcode)


def _is_consequence(failure: WorkerFailure, timeout_ranks: set[int]) -> bool:
    """Errors that usually follow another rank's failure rather than cause it."""
    text = failure.message.lower()
    return failure.rank in timeout_ranks or any(m in text for m in _CONSEQUENCE_MARKERS)


def _rank_list(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


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
    lines = [f"  {_rank_list([f.rank for f in g])}: {g[0].first_line}" for g in groups]
    return ("Other failures:\n" + "\n".join(lines)) if lines else ""


def _timeout_error(
    root: list[WorkerFailure], world_size: int, status: dict[int, str], timeout_s: float
) -> CollectiveTimeoutError:
    timed_out = sorted(f.rank for f in root)
    missing = [r for r in range(world_size) if r not in timed_out]
    detail = "; ".join(f"rank {r} {status.get(r, 'was still running')}" for r in missing)
    if len(missing) == 1:
        detail = status.get(missing[0], "was still running")
    absent = f" {_rank_list(missing).capitalize()} did not arrive ({detail})." if missing else ""
    message = (
        f"A collective timed out after {timeout_s:g} s on {_rank_list(timed_out)} of {world_size}."
        f"{absent} Make sure every rank calls the same collectives in the same order, or raise "
        f"`timeout=` if the work between two collectives legitimately takes longer."
    )
    return CollectiveTimeoutError(message, root)


def _decorate(
    error: BaseException, root: list[WorkerFailure], note: str, ordered: list[WorkerFailure]
) -> BaseException:
    """Attach the worker traceback (as the cause), the ranks (as a note) and every record."""
    ranks = [f.rank for f in root]
    if root[0].traceback:
        header = f"Traceback from {_rank_list(ranks)} (worker side):\n"
        error.__cause__ = RemoteTraceback(header + root[0].traceback.rstrip())
    if hasattr(error, "add_note"):
        error.add_note(note)
    try:
        error.nb_accel_failures = ordered  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass
    return error


def build_exception(
    ordered: list[WorkerFailure],
    timeout_ranks: set[int],
    world_size: int,
    status: dict[int, str],
    timeout_s: float,
) -> BaseException:
    """Choose the root cause among ``ordered`` (arrival order) and build the exception to raise.

    Args:
        ordered: every failure record, first received first.
        timeout_ranks: ranks whose failure was a collective timeout.
        world_size: number of ranks in the launch.
        status: for ranks that did not fail, what they did ("had already returned", ...).
        timeout_s: the launch's collective timeout.
    """
    deaths = [f for f in ordered if f.signal_name]
    causes = [f for f in ordered if not f.signal_name and not _is_consequence(f, timeout_ranks)]
    first = (deaths or causes or ordered)[0]
    groups = _group(ordered)
    root = next(g for g in groups if first in g)
    ranks = [f.rank for f in root]
    summary = _others_summary([g for g in groups if g is not root])
    if first.rank in timeout_ranks and not deaths and not causes:
        return _timeout_error(root, world_size, status, timeout_s)
    if first.signal_name or first.type_name == "exit":
        text = first.message + (f" (same on {_rank_list(ranks)})" if len(ranks) > 1 else "")
        return WorkerDiedError(text + ("\n" + summary if summary else ""), ordered)
    error: BaseException = first.exception or WorkerError(
        f"{first.first_line} (on {_rank_list(ranks)}; the exception could not be "
        "moved to the kernel, so it is re-raised as WorkerError)",
        ordered,
    )
    note = f"Raised on {_rank_list(ranks)} of {world_size}"
    note += f" (host {first.host})" if first.host else ""
    note += " (identical on each)" if len(ranks) > 1 else ""
    failed = {f.rank for f in ordered}
    bystanders = [f"rank {r} {status[r]}" for r in sorted(status) if r not in failed]
    if bystanders and not causes:
        note += "; " + ", ".join(bystanders) + " (every rank must call the same collectives)"
    return _decorate(error, root, note + ("\n" + summary if summary else ""), ordered)
