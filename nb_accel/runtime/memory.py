"""``find_executable_batch_size``: retry a function with a smaller batch after running out of
memory, as Accelerate's decorator of that name does; across ranks, every rank retries when any
ran out, all with the same size (:class:`BatchAgreement`).

Run alone, each rank would retry on its own: a rank that ran out of memory at 64 retries at 57
while the others, waiting for it in a collective, fail or go on at 64, and the next collective
pairs tensors of different sizes. So every attempt of a decorated call ends with a vote in the
default process group's store (which no collective can hold up): ``ok``, ``oom``, ``lost`` (a
collective failed because a peer let go) or ``failed`` (any other error, raised at once). A
rank that runs out of memory lets go of its process group first, so that the ranks waiting for
it in a collective are freed (gloo's connections close, and each freed rank lets go of its own
in turn; NCCL ranks abort their own communicator when they see its word in the store,
:meth:`BatchAgreement.watch`). When any rank voted ``oom``, each proposes its next size
(``reduce_batch_size_fn`` or nine tenths), all take the smallest, and the process group is made
anew before the next attempt.
"""

from __future__ import annotations

import functools
import gc
import inspect
import itertools
import threading
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from ..errors import is_peer_loss
from .device_types import device_types, rank_device_type
from .groups.remaking import (
    abort_process_group,
    command_scope,
    current_group,
    let_go_of_process_group,
    remake_process_group,
)
from .process_group import applied_timeout_s

__all__ = [
    "BatchAgreement",
    "Vote",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
]

#: Messages of the errors a smaller batch may cure (device or CPU out of memory, cuDNN).
_OUT_OF_MEMORY = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when ``exception`` says memory ran out (``torch.OutOfMemoryError`` or a
    ``RuntimeError`` with an out-of-memory message), so that a smaller batch may fit."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(text in str(exception.args[0]) for text in _OUT_OF_MEMORY)
    return False


def _free_cached_memory() -> None:
    gc.collect()
    for device in device_types():  # each empties its own cache, if it has one in use
        device.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop these references and free cached device memory; returns a list of ``None`` to
    assign back: ``model, optimizer = release_memory(model, optimizer)``."""
    released: list[None] = [None for _ in objects]
    del objects
    _free_cached_memory()
    return released


#: How an attempt went on one rank.
Vote = Literal["ok", "oom", "lost", "failed"]

#: How often an NCCL rank looks for another rank's word that it ran out of memory.
WATCH_INTERVAL_S = 0.05

#: Numbers of the decorated calls of this process (the same sequence on every rank).
_calls: list[itertools.count[int]] = [itertools.count()]
#: What the numbers count within (a pool's command: its ranks may have called a different
#: number of decorated functions in an earlier command that failed).
_scope: list[str] = [""]


def _next_call() -> str:
    scope = command_scope()
    if scope != _scope[0]:
        _scope[0], _calls[0] = scope, itertools.count()
    return f"{scope}/{next(_calls[0])}"


def _agreement_needed() -> bool:
    """Whether the ranks must agree (a process group of more than one rank)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class BatchAgreement:
    """One decorated call's attempts, agreed across the ranks (see the module). Create it on
    every rank at the start of the call.

    Args:
        name: the decorated function's name, for messages.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._call = _next_call()
        self._origin = current_group()
        self._store = self._origin.store
        #: Whether this rank aborted its collectives because another ran out of memory.
        self.aborted = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _key(self, attempt: int, what: str) -> str:
        return f"nb_accel/batch/{self._call}/{attempt}/{what}"

    def watch(self, attempt: int) -> None:
        """While ``attempt`` runs, abort this rank's NCCL collectives once another rank says
        it ran out of memory (an NCCL collective does not fail when a peer drops its
        communicator). Gloo ranks need no watcher: the peer's connections close."""
        self.aborted = False
        origin = self._origin
        devices = rank_device_type(origin.backend, origin.world_size, cpu=False)
        if not devices.detached_collectives(origin.backend):
            return
        self._stop.clear()
        self._watcher = threading.Thread(
            target=self._watch, args=(attempt,), name="nb_accel-batch-agreement", daemon=True
        )
        self._watcher.start()

    def _watch(self, attempt: int) -> None:
        key = self._key(attempt, "oom")
        while not self._stop.wait(WATCH_INTERVAL_S):
            if self._store.check([key]):
                self.aborted = True
                abort_process_group()
                return

    def stop_watching(self) -> None:
        """The attempt has ended on this rank."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None

    def ran_out(self, attempt: int) -> None:
        """This rank ran out of memory in ``attempt``: say so, and let go of the process group
        (:meth:`let_go`)."""
        self._store.set(self._key(attempt, "oom"), "1")
        self.let_go()

    def let_go(self) -> None:
        """Drop this rank's process group, its connections shut down first (whatever still
        holds the group): the ranks waiting for this one are freed, and in turn let go of
        theirs (a rank may wait for a peer that waits for the one that left)."""
        let_go_of_process_group()

    def vote(self, attempt: int, vote: Vote, wait: bool = True) -> list[Vote]:
        """Cast this rank's ``vote`` on ``attempt``; every rank's, in rank order, once all are
        in (``wait``; else only this rank's)."""
        if not wait:
            self._store.set(self._key(attempt, f"vote/{self._origin.rank}"), vote)
            return [vote]
        return self._exchange(attempt, "vote", vote)  # type: ignore[return-value]

    def agree(self, attempt: int, proposal: int) -> int:
        """The next batch size: the smallest every rank proposes."""
        return min(int(size) for size in self._exchange(attempt, "size", str(proposal)))

    def _exchange(self, attempt: int, what: str, value: str) -> list[str]:
        """Give this rank's ``value`` of ``what``; every rank's, in rank order."""
        self._store.set(self._key(attempt, f"{what}/{self._origin.rank}"), value)
        keys = [self._key(attempt, f"{what}/{r}") for r in range(self._origin.world_size)]
        self._wait(keys, attempt)
        return [self._store.get(key).decode() for key in keys]

    def _wait(self, keys: list[str], attempt: int) -> None:
        try:
            self._store.wait(keys)
        except RuntimeError as error:  # torch's DistStoreError among them
            raise RuntimeError(
                f"find_executable_batch_size gave up waiting for the other ranks' outcome of "
                f"attempt {attempt + 1} of {self._name} ({error}): every rank must call it, "
                "the same number of times"
            ) from None

    def regroup(self, attempt: int) -> None:
        """Make the process group anew on every rank, for the next attempt."""
        applied = applied_timeout_s()
        seconds = applied if applied is not None else default_pg_timeout.total_seconds()
        remake_process_group(self._origin, self._key(attempt, "group"), seconds)


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, *args, **kwargs)`` from ``starting_batch_size``
    down, until a call finishes without running out of memory.

    After an out-of-memory error (see :func:`should_reduce_batch_size`) the cached memory is
    freed and the batch size becomes ``int(batch_size * 0.9)`` (or ``reduce_batch_size_fn()``);
    other exceptions propagate. The size reached is kept for the next call. Call the decorated
    function without the batch size: ``train(model)`` for ``def train(batch_size, model)``.

    Raises:
        RuntimeError: when the batch size reaches zero.
        TypeError: when the caller passes the batch size itself.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size

    def smaller() -> int:
        return reduce_batch_size_fn() if reduce_batch_size_fn is not None else int(batch_size * 0.9)

    def check_size() -> None:
        if batch_size <= 0:
            raise RuntimeError(
                f"{function.__name__} ran out of memory at every batch size down to 1 "
                f"(from {starting_batch_size}): free memory or make each sample smaller"
            )

    def alone(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        while True:
            check_size()
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                del exc  # its traceback holds the failed call's tensors
                _free_cached_memory()
                batch_size = smaller()

    def together(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        agreement = BatchAgreement(function.__name__)
        attempt = -1
        while True:
            attempt += 1
            check_size()
            call = functools.partial(function, batch_size, *args, **kwargs)
            result, vote, error = _attempt(agreement, attempt, call)
            if vote == "failed":  # its own error: the launch or cell reports it
                agreement.vote(attempt, vote, wait=False)
                raise error  # type: ignore[misc]
            votes = agreement.vote(attempt, vote)
            if "failed" in votes:  # another rank's error ends the call on every rank
                if vote == "ok":
                    return result
                raise RuntimeError(
                    f"{function.__name__} stopped retrying at batch size {batch_size} because "
                    f"another rank failed (rank {votes.index('failed')})"
                ) from error
            if "oom" in votes:  # every rank retries, with the same smaller size
                del error, result
                _free_cached_memory()
                batch_size = agreement.agree(attempt, smaller())
                agreement.regroup(attempt)
                continue
            if error is not None:
                raise error
            return result

    @functools.wraps(function)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) < len(args) + 1:
            raise TypeError(
                f"{function.__name__} was called with its batch size as first argument; "
                "find_executable_batch_size passes it: leave it out of the call"
            )
        _free_cached_memory()
        return together(*args, **kwargs) if _agreement_needed() else alone(*args, **kwargs)

    return decorated


def _attempt(
    agreement: BatchAgreement, attempt: int, run: Callable[[], Any]
) -> tuple[Any, Vote, BaseException | None]:
    """Run one attempt on this rank: its result, its vote and its error (an out-of-memory
    error is dropped at once, and so is this rank's process group: see
    :meth:`BatchAgreement.ran_out`)."""
    agreement.watch(attempt)
    try:
        return run(), "ok", None
    except Exception as exc:  # noqa: BLE001 - voted on, then raised or retried
        if should_reduce_batch_size(exc):
            del exc  # its traceback holds the failed call's tensors
            agreement.ran_out(attempt)
            return None, "oom", None
        if agreement.aborted or is_peer_loss(str(exc)):
            agreement.let_go()  # the ranks waiting for this one are freed in turn
            return None, "lost", exc
        return None, "failed", exc
    finally:
        agreement.stop_watching()
