"""A persistent worker: the command loop behind ``%%distributed`` cells.

A pool is an ordinary launch whose function is :func:`serve`: it keeps the process group and
one namespace (preloaded with ``accelerator``, ``rank`` and ``world_size``) and runs the
kernel's commands — a cell's code, setting variables, reading one — until told to stop.
Each command ends with a :class:`~nb_accel._messages.CellDone` event; an exception in a cell
is reported in it and the worker carries on. Kernel → Interrupt reaches the worker as SIGINT,
which raises ``KeyboardInterrupt`` in the running cell. After such a failure or interrupt the
kernel sends :class:`~nb_accel.runtime.workers.regroup.Settle` before the next command.
"""

from __future__ import annotations

import ast
import linecache
import pickle
import signal
import sys
from typing import Any

import cloudpickle

from ..._messages import CellDone, Execute, Pull, Push, Stop
from ..reporting.channel import EventChannel, current_channel
from ..reporting.reporter import flush_reporter
from .entrypoint import failure_event
from .regroup import Settle, settle_process_group
from .returns import dumps_result

__all__ = ["run_code", "serve"]


def run_code(code: str, namespace: dict[str, Any], filename: str) -> Any:
    """Run ``code`` in ``namespace`` like a notebook cell; returns the value of a final bare
    expression (``None`` otherwise). Tracebacks show the cell's lines."""
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    tree = ast.parse(code, filename, "exec")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, filename, "exec"), namespace)  # running the user's cell is the point
    if last is None:
        return None
    expression = ast.Expression(last.value)
    return eval(compile(expression, filename, "eval"), namespace)


def _reply(channel: EventChannel, cell: int, value: Any, want: bool) -> CellDone:
    if not want:
        return CellDone(channel.rank, cell)
    try:
        return CellDone(channel.rank, cell, value=dumps_result(value))
    except Exception:  # noqa: BLE001 - an unpicklable value is shown by its repr
        return CellDone(channel.rank, cell, value_repr=repr(value))


def _perform(
    channel: EventChannel, command: Execute | Push | Pull | Settle, space: dict[str, Any]
) -> CellDone:
    if isinstance(command, Execute):
        value = run_code(command.code, space, command.name or f"<cell {command.cell}>")
        wanted = not command.value_ranks or channel.rank in command.value_ranks
        return _reply(channel, command.cell, value, command.want_value and wanted)
    if isinstance(command, Push):
        space.update(cloudpickle.loads(command.data))
        return CellDone(channel.rank, command.cell)
    if isinstance(command, Settle):  # rank 0 tells the kernel what was rebuilt
        issued = settle_process_group(command)
        return _reply(channel, command.cell, issued, channel.rank == 0)
    if command.name not in space:
        raise NameError(f"name {command.name!r} is not defined on rank {channel.rank}")
    return _reply(channel, command.cell, space[command.name], True)


def _outcome(
    channel: EventChannel, command: Execute | Push | Pull | Settle, space: dict[str, Any]
) -> CellDone:
    """Perform ``command``; the reply says what it returned or raised."""
    try:
        return _perform(channel, command, space)
    except BaseException as error:  # noqa: BLE001 - reported; the worker lives on
        failed = error
    while True:  # an interrupt held back while native code ran can land here: the command
        try:  # has failed already, so the reply is built again
            failure = failure_event(channel.rank, failed, (__file__,))
            return CellDone(channel.rank, command.cell, failure=failure)
        except KeyboardInterrupt:
            continue


def serve() -> None:
    """Run the kernel's commands in one namespace until :class:`~nb_accel._messages.Stop`."""
    from ..accelerator import Accelerator  # the pool's process group is up by now

    channel = current_channel()
    if channel is None:
        raise RuntimeError("serve() runs inside a launched worker only")
    accelerator = Accelerator()
    space: dict[str, Any] = {
        "__name__": "__main__",
        "accelerator": accelerator,
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
    }
    signal.signal(signal.SIGINT, signal.default_int_handler)
    while True:
        try:
            command = pickle.loads(channel.receive())
        except KeyboardInterrupt:
            continue  # an interrupt that arrived between two commands
        except EOFError:
            return
        if isinstance(command, Stop):
            return
        done = _outcome(channel, command, space)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            flush_reporter()
            channel.send(done)
        except KeyboardInterrupt:
            channel.send(done)
