"""Starting one worker process per rank, by fork, forkserver or spawn, and signalling it.

Every worker leads its own process group, so stopping it also stops what it started (DataLoader
workers, for example). Its exit is watched through a pidfd where Linux offers one.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from ..worker.process.entrypoint import run_worker
from ..worker.process.spec import WorkerArgs
from .captured import CapturedOutput
from .failures.oom import oom_kills

__all__ = [
    "START_METHODS",
    "WorkerProcess",
    "resident_mb",
    "start_worker",
]

START_METHODS = ("fork", "spawn", "forkserver")

_SPAWN_CODE = "from nb_accel.worker.process.entrypoint import spawn_main; spawn_main()"


def process_frozen(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, Ctrl-Z, a debugger holding it): it runs no
    code, acts on no signal but SIGKILL (a SIGTERM waits until it is continued), and answers
    nothing. ``False`` where the system does not say (no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


class WorkerProcess:
    """A started worker: its rank, pid, event connection, an exit sentinel and the pipes its
    file descriptors 1 and 2 write to (``captured``)."""

    def __init__(
        self,
        rank: int,
        pid: int,
        conn: Connection,
        handle: Any,
        captured: CapturedOutput | None = None,
    ) -> None:
        self.rank = rank
        self.pid = pid
        self.conn = conn
        self.captured = captured
        self._handle = handle
        self._exitcode: int | None = None  # kept when the handle is closed
        self._closed = False
        self._pidfd: int | None = None
        #: The machine's count of out-of-memory kills when the worker was started: what a
        #: ``SIGKILL`` was is told by whether it rose (:mod:`~.failures.oom`).
        self.oom_kills_at_start = oom_kills()
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(pid)
            except OSError:
                self._pidfd = None

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process exits."""
        if self._pidfd is not None:
            return self._pidfd
        if isinstance(self._handle, subprocess.Popen):
            return self._handle.sentinel_fd  # type: ignore[attr-defined, no-any-return]
        return int(self._handle.sentinel)

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or ``None`` while running."""
        if self._closed:
            return self._exitcode
        if isinstance(self._handle, subprocess.Popen):
            return self._handle.poll()
        return self._handle.exitcode  # type: ignore[no-any-return]

    def frozen(self) -> bool:
        """Whether the process is stopped (see :func:`process_frozen`)."""
        return process_frozen(self.pid)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the worker's whole process group (falls back to the worker)."""
        try:
            os.killpg(self.pid, signum)
            return
        except (ProcessLookupError, PermissionError):
            pass
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def reap(self) -> None:
        """Wait for the (already signalled or exited) process to be gone."""
        if self._closed:
            return
        if isinstance(self._handle, subprocess.Popen):
            self._handle.wait()
        else:
            self._handle.join()

    def close(self) -> None:
        """Release the connection, the sentinel and the output pipes, and, once the process
        has been reaped, its handle (closing again does nothing).

        A ``multiprocessing`` process keeps two pipes of its own (its sentinel and the other
        end of it) until :meth:`multiprocessing.Process.close`: without it they stay open
        until the garbage collector happens to free the handle. A process still running (an
        interrupt came while it was being stopped) keeps its handle, so that it can still be
        reaped."""
        self.conn.close()
        if self.captured is not None:
            self.captured.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        sentinel_fd = getattr(self._handle, "sentinel_fd", None)
        if sentinel_fd is not None:
            os.close(sentinel_fd)
            self._handle.sentinel_fd = None
        if self._closed or (code := self.poll()) is None:
            return
        self._exitcode, self._closed = code, True
        if not isinstance(self._handle, subprocess.Popen):
            self._handle.close()


def resident_mb(pid: int) -> float | None:
    """The resident memory of process ``pid`` in MB (``None`` when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _start_multiprocessing(method: str, args: WorkerArgs) -> WorkerProcess:
    context = multiprocessing.get_context(method)
    parent_conn, child_conn = context.Pipe(duplex=True)
    parent_pid = os.getpid() if method == "fork" else None
    captured = CapturedOutput(args.rank)
    output = captured.child_ends()
    process = context.Process(  # type: ignore[attr-defined]
        target=run_worker,
        args=(child_conn, args, parent_pid, output),
        name=f"nb_accel-rank{args.rank}",
        daemon=False,
    )
    try:
        process.start()
    except BaseException:  # no worker: nothing will close these later
        parent_conn.close()
        captured.close()
        raise
    finally:  # the child has its own copies
        child_conn.close()
        for end in output:
            end.close()
    assert process.pid is not None
    try:
        os.setpgid(process.pid, process.pid)
    except OSError:
        pass  # the worker sets its own group too; whichever runs first wins
    return WorkerProcess(args.rank, process.pid, parent_conn, process, captured)


def _start_spawned(args: WorkerArgs) -> WorkerProcess:
    parent_conn, child_conn = multiprocessing.Pipe(duplex=True)
    fds: tuple[int, ...] = (child_conn.fileno(),)
    sentinel_read: int | None = None
    sentinel_write: int | None = None
    if not hasattr(os, "pidfd_open"):
        sentinel_read, sentinel_write = os.pipe()
        fds += (sentinel_write,)
    env = dict(os.environ)
    env["NB_ACCEL_CHANNEL_FD"] = str(child_conn.fileno())
    env["NB_ACCEL_PARENT_PID"] = str(os.getpid())
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    captured = CapturedOutput(args.rank)
    try:
        popen = subprocess.Popen(
            [sys.executable, "-c", _SPAWN_CODE],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=captured.write_fds[0],
            stderr=captured.write_fds[1],
            env=env,
            start_new_session=True,
        )
    except BaseException:  # no worker: nothing will close these later
        parent_conn.close()
        captured.close()
        if sentinel_read is not None:
            os.close(sentinel_read)
        raise
    finally:  # the child has its own copies
        child_conn.close()
        captured.close_write_ends()
        if sentinel_write is not None:
            os.close(sentinel_write)
    popen.sentinel_fd = sentinel_read  # type: ignore[attr-defined]
    return WorkerProcess(args.rank, popen.pid, parent_conn, popen, captured)


def start_worker(method: str, args: WorkerArgs) -> WorkerProcess:
    """Start the worker for ``args.rank`` with the given start method."""
    if method == "spawn":
        return _start_spawned(args)
    if method in ("fork", "forkserver"):
        return _start_multiprocessing(method, args)
    raise ValueError(f"start_method={method!r} is not one of {START_METHODS}")


def send_start_data(worker: WorkerProcess, method: str, args: WorkerArgs) -> None:
    """Hand a spawned worker its arguments (fork and forkserver receive them at start)."""
    if method != "spawn":
        return
    try:
        worker.conn.send_bytes(pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # the worker died already; the supervisor reports how


@contextlib.contextmanager
def multiprocessing_helpers(method: str) -> Iterator[None]:
    """Around a launch: with ``forkserver``, preload nb_accel (not ``__main__``) in the server,
    and stop the server and resource tracker afterwards if this launch started them."""
    if method != "forkserver":
        yield
        return
    from multiprocessing import forkserver, resource_tracker

    # The module's own server and tracker (private names of multiprocessing: a Python without
    # them starts its server as it would for any forkserver launch, and keeps it).
    server: Any = getattr(forkserver, "_forkserver", None)
    tracker: Any = getattr(resource_tracker, "_resource_tracker", None)
    if server is None or tracker is None:
        yield
        return
    server_was_running = getattr(server, "_forkserver_pid", None) is not None
    tracker_was_running = getattr(tracker, "_pid", None) is not None
    previous_preload = list(getattr(server, "_preload_modules", ["__main__"]))
    if not server_was_running:
        server.set_forkserver_preload(["nb_accel.worker.process.entrypoint"])
    try:
        yield
    finally:
        if not server_was_running:
            getattr(server, "_stop", _nothing)()
            server.set_forkserver_preload(previous_preload)
        if not tracker_was_running:
            getattr(tracker, "_stop", _nothing)()


def _nothing() -> None:
    """What stopping a helper process does where multiprocessing cannot stop it."""
