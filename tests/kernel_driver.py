"""Helpers to drive a real Jupyter kernel (jupyter_client) from a test."""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client import KernelManager
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager

#: Generous bound on one cell in tests (a hang fails instead of blocking the suite).
CELL_TIMEOUT_S = 90.0


@dataclass
class CellRun:
    """What a cell produced: streamed text, its reply status and error fields."""

    stdout: str = ""
    stderr: str = ""
    status: str = ""
    ename: str = ""
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)


def _wrapped_kernel(folder: Path, wrap: list[str], ip: str | None) -> KernelManager:
    """A manager for a kernel started by ``wrap`` (a command that runs the command after it:
    ``unshare ...``), described by a kernel spec of its own in ``folder``; listening on ``ip``
    where given (a kernel in another network namespace), interrupted by a message then (its
    process is not the one ``wrap`` started)."""
    spec = folder / "kernels" / "wrapped"
    spec.mkdir(parents=True)
    argv = [*wrap, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    described = {"argv": argv, "display_name": "wrapped", "language": "python"}
    if ip is not None:
        described["interrupt_mode"] = "message"
    (spec / "kernel.json").write_text(json.dumps(described))
    specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])
    manager = KernelManager(kernel_name="wrapped", kernel_spec_manager=specs)
    if ip is not None:  # jupyter_client starts kernels on this machine's addresses only
        manager.ip = "0.0.0.0"  # every address of the kernel's namespace
        manager.connection_file = str(folder / "kernel-connection.json")  # in its command
    return manager


@contextmanager
def running_kernel(
    folder: Path | None = None,
    scratch: Path | None = None,
    env: dict[str, str] | None = None,
    wrap: list[str] | None = None,
    ip: str | None = None,
) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """A started kernel and its client (started in ``folder``, its ``TMPDIR`` ``scratch``,
    where given, with ``env`` added to this process's environment, and by ``wrap`` where
    given, listening on ``ip`` then: see :func:`_wrapped_kernel`); shut down (and its processes
    gone) on exit, or cleaned up after if the test killed it."""
    if wrap is not None:
        assert folder is not None, "a wrapped kernel's spec goes in its folder"
        manager = _wrapped_kernel(folder, wrap, ip)
    else:
        manager = KernelManager(kernel_name="python3")
    if folder is None and env is None:
        manager.start_kernel()
    else:
        environ = {**os.environ, **(env or {})}
        if folder is not None:
            environ["TMPDIR"] = str(scratch or folder)
        manager.start_kernel(cwd=str(folder or os.getcwd()), env=environ)
    if ip is not None:  # reached at its namespace's address (the control socket reconnected)
        manager.ip = ip
        manager._close_control_socket()
        manager._connect_control_socket()
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield manager, client
    finally:
        client.stop_channels()
        if manager.is_alive():  # at exit, it stops its pool and removes its folder
            manager.shutdown_kernel(now=False)
        else:
            manager.cleanup_resources()


def start_cell(client: BlockingKernelClient, code: str) -> str:
    """Send ``code`` for execution; return the message id.

    ``stop_on_error=False``: each cell is the test's own step, sent once the one before has
    ended. ipykernel 6 (Colab's) aborts the requests that reach it just after a failed one, in a
    window that a test's next cell, sent at once, can fall into; a person's next cell never does.
    """
    return client.execute(code, store_history=False, stop_on_error=False)


def cell_messages(client: BlockingKernelClient, msg_id: str) -> Iterator[dict[str, Any]]:
    """The iopub messages of cell ``msg_id`` as they come, its final ``idle`` status last; a
    ``TimeoutError`` when the cell does not finish within :data:`CELL_TIMEOUT_S`."""
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            message = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        yield message
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return
    raise TimeoutError(f"cell did not finish within {CELL_TIMEOUT_S} s")


def collect(client: BlockingKernelClient, msg_id: str, until: tuple[str, ...] = ()) -> CellRun:
    """Gather iopub output of ``msg_id`` until the kernel is idle, or until every text in
    ``until`` has appeared in the cell's output."""
    run = CellRun()
    for message in cell_messages(client, msg_id):
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            setattr(run, content["name"], getattr(run, content["name"]) + content["text"])
            if until and all(text in run.stdout + run.stderr for text in until):
                return run
        elif kind in ("execute_result", "display_data"):
            run.results.append(content["data"])
        elif kind == "error":
            run.ename, run.evalue, run.traceback = (
                content["ename"],
                content["evalue"],
                content["traceback"],
            )
    while True:  # the reply to this cell (a reply to an earlier cell may still be queued)
        reply = client.get_shell_msg(timeout=CELL_TIMEOUT_S)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    run.status = reply["content"]["status"]
    if run.status == "error" and not run.ename:  # the reply says what the output did not
        run.ename = reply["content"].get("ename", "")
        run.evalue = reply["content"].get("evalue", "")
        run.traceback = reply["content"].get("traceback", [])
    return run


def run_cell(client: BlockingKernelClient, code: str) -> CellRun:
    """Execute ``code`` and wait for it to finish."""
    return collect(client, start_cell(client, code))


def run_answering(
    client: BlockingKernelClient, code: str, answers: list[str], hold_s: float = 0.0
) -> tuple[CellRun, list[str]]:
    """Execute ``code`` with input allowed, answering each prompt with the next of ``answers``
    (``q`` once they run out, so that a debugger never waits forever); returns what the cell
    produced and the prompts, in order. ``hold_s``: how long the first prompt stays open
    before it is answered (a user taking their time: the duration is what is tested)."""
    run, prompts, pending = CellRun(), [], list(answers)

    def output(message: dict[str, Any]) -> None:
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            setattr(run, content["name"], getattr(run, content["name"]) + content["text"])
        elif kind == "error":
            run.ename, run.evalue, run.traceback = (
                content["ename"],
                content["evalue"],
                content["traceback"],
            )

    def answer(message: dict[str, Any]) -> None:
        if hold_s and not prompts:
            threading.Event().wait(hold_s)
        prompts.append(message["content"]["prompt"])
        client.input(pending.pop(0) if pending else "q")

    reply = client.execute_interactive(  # type: ignore[attr-defined]
        code,
        allow_stdin=True,
        store_history=False,
        stop_on_error=False,  # as in start_cell
        timeout=CELL_TIMEOUT_S,
        output_hook=output,
        stdin_hook=answer,
    )
    run.status = reply["content"]["status"]
    if run.status == "error" and not run.ename:  # the reply says what the output did not
        run.ename = reply["content"].get("ename", "")
        run.evalue = reply["content"].get("evalue", "")
        run.traceback = reply["content"].get("traceback", [])
    return run, prompts
