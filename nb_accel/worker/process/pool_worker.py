"""A persistent worker: the command loop behind ``%%distributed`` cells.

A pool is an ordinary launch whose function is :func:`serve`: it keeps the process group and
one namespace (preloaded with ``accelerator``, ``rank`` and ``world_size``) and runs the
kernel's commands — a cell's code, setting variables, reading one, a launch's function on warm
workers (:mod:`~nb_accel.worker.warm.call`) — until told to stop.
Each command ends with a :class:`~nb_accel._messages.CellDone` event; an exception in a cell
is reported in it and the worker carries on. Kernel → Interrupt reaches the worker as SIGINT,
which raises ``KeyboardInterrupt`` in the running cell. After such a failure or interrupt the
kernel sends :class:`~nb_accel._messages.Settle` before the next command.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import re
import signal
import time
import types
from collections.abc import Mapping
from typing import Any

from ..._messages import (
    Answer,
    Call,
    CellDone,
    Debug,
    Execute,
    Interrupt,
    Pull,
    Push,
    Release,
    Settle,
    Stop,
    decode_command,
)
from ..debugging.breakpoints import DebuggerQuit, quit_explained
from ..debugging.deadline import forget_in_flight, set_expiry
from ..debugging.post_mortem import debug_failure, keep_failure
from ..reporting.channel import EventChannel, current_channel
from ..transfer.pickling import loads
from ..warm.call import run_call
from ..warm.fresh_modules import note_new_modules
from ..warm.residents import bind_namespace
from .lifecycle import StopRequested, send_flushed
from .outcomes import deadline_failure, failure_event
from .regroup import (
    begin_command,
    forget_abort_for_peer,
    free_for_deadline,
    release_broken_group,
    release_process_group,
    settle_process_group,
    take_abort_for_peer,
    take_deadline,
)
from .returns import check_returnable, dumps_result

__all__ = ["run_code", "serve", "user_names"]

#: The names IPython gives a namespace of its own (``_``, ``_i3``, ``_3``, ``In``, ...), which
#: a cell may have pushed or copied into a worker's.
_IPYTHON_NAMES = re.compile(r"_+|_i+|_i?\d+|_[oid]h|In|Out|exit|quit|get_ipython")


def user_names(namespace: Mapping[str, Any]) -> list[str]:
    """The user's variables in ``namespace`` (a worker's), in the order they were first set:
    modules, dunder names and IPython's own names left out."""
    return [
        name
        for name, value in namespace.items()
        if not (name.startswith("__") and name.endswith("__"))
        and not _IPYTHON_NAMES.fullmatch(name)
        and not isinstance(value, types.ModuleType)
    ]


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


_Work = Execute | Push | Pull | Call | Debug | Settle


def _perform(channel: EventChannel, command: _Work, space: dict[str, Any]) -> CellDone:
    begin_command(command.cell)  # find_executable_batch_size's agreements are numbered anew
    if isinstance(command, Call):  # a launch's value travels as a cold launch's: or it fails
        return CellDone(
            channel.rank, command.cell, value=dumps_result(run_call(command, check_returnable))
        )
    if isinstance(command, Execute):
        value = run_code(command.code, space, command.name or f"<cell {command.cell}>")
        wanted = not command.value_ranks or channel.rank in command.value_ranks
        return _reply(channel, command.cell, value, command.want_value and wanted)
    if isinstance(command, Push):
        space.update(loads(command.data))
        return CellDone(channel.rank, command.cell)
    if isinstance(command, Debug):  # a post-mortem: the prompts go to the kernel
        debug_failure(channel, command.failed_cell)
        return CellDone(channel.rank, command.cell)
    if isinstance(command, Settle):  # rank 0 tells the kernel what was rebuilt
        issued = settle_process_group(command)
        return _reply(channel, command.cell, issued, channel.rank == 0)
    if command.name not in space:
        raise NameError(f"name {command.name!r} is not defined on rank {channel.rank}")
    return _reply(channel, command.cell, space[command.name], True)


#: How long a worker waits for the SIGINT that follows an :class:`Interrupt` message.
SIGNAL_WAIT_S = 0.5


class _Interrupts:
    """SIGINT in a persistent worker: raised as ``KeyboardInterrupt`` only while a command
    runs; otherwise only noted, so that it never lands in the middle of reading a command or
    sending a reply (the stream would be out of step). Python runs the handler in the main
    thread between two bytecodes, so the flags need no lock."""

    def __init__(self) -> None:
        self.running = False
        self.pending = False

    def handle(self, signum: int, frame: object) -> None:
        """The SIGINT handler."""
        if self.running:
            raise KeyboardInterrupt
        self.pending = True

    def take(self, wait_s: float) -> bool:
        """Consume a noted SIGINT, waiting up to ``wait_s`` for it; True if there was one."""
        deadline = time.monotonic() + wait_s
        while not self.pending and time.monotonic() < deadline:
            time.sleep(0.005)
        found, self.pending = self.pending, False
        return found


_interrupts = _Interrupts()


def _outcome(channel: EventChannel, command: _Work, space: dict[str, Any]) -> tuple[CellDone, bool]:
    """Perform ``command`` with interrupts let through; the reply says what it returned or
    raised, and whether an interrupt stopped it. A collective that outlasted the rank's own
    deadline meanwhile fails the command with that timeout (unless the user interrupted it)."""
    forget_abort_for_peer()
    error: BaseException | None = None
    try:
        _interrupts.running = True
        try:
            if _interrupts.take(0):  # it came between the check and now
                raise KeyboardInterrupt
            done = _perform(channel, command, space)
        finally:
            _interrupts.running = False
    except StopRequested:  # the pool is stopped: not a cell's failure
        raise
    except BaseException as raised:  # noqa: BLE001 - reported; the worker lives on
        error = quit_explained(take_abort_for_peer(raised), channel.rank)
        if not isinstance(command, Debug) and not isinstance(error, DebuggerQuit):
            keep_failure(command.cell, error)  # its frames, for a post-mortem
    forget_in_flight()  # what is still in flight was this command's: never acted on now
    expired = take_deadline()
    if expired is None and error is not None:
        release_broken_group(error)
    stopped = isinstance(error, KeyboardInterrupt)
    if expired is not None and not stopped:  # our abort's words are a consequence
        message, collective, stack, at_prompt = expired
        failure = deadline_failure(channel.rank, message, collective, stack, at_prompt)
    elif error is not None:
        failure = failure_event(channel.rank, error, (__file__,))
    else:
        return done, False
    return CellDone(channel.rank, command.cell, failure=failure), stopped


def _interrupted_before_start(channel: EventChannel, cell: int) -> bool:
    """Whether the kernel interrupted command ``cell`` while this worker was reading it."""
    if channel.poll():  # only the Interrupt for this command can be queued behind it
        message = decode_command(channel.receive())
        if not isinstance(message, Interrupt) or message.cell != cell:
            raise RuntimeError(f"unexpected message from the kernel during a command: {message}")
        _interrupts.take(SIGNAL_WAIT_S)
        return True
    _interrupts.take(0)  # a SIGINT without the kernel's word (sent by hand): not for this one
    return False


def serve() -> None:
    """Run the kernel's commands in one namespace until :class:`~nb_accel._messages.Stop`."""
    from ...runtime.accelerator import Accelerator  # the pool's process group is up by now

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
    bind_namespace(space)  # residents are variables of the cells too
    note_new_modules()  # the user's modules as this worker has them: a change is reloaded
    signal.signal(signal.SIGINT, _interrupts.handle)
    set_expiry(free_for_deadline)  # a cell past the timeout fails; the pool lives on
    interrupted = -1  # the last command an interrupt stopped (its signal is spent)
    while True:
        try:
            command = decode_command(channel.receive())
        except EOFError:
            return
        if isinstance(command, Stop):
            return
        if isinstance(command, Interrupt):  # for a command that has ended
            _interrupts.take(0 if command.cell == interrupted else SIGNAL_WAIT_S)
            continue
        if isinstance(command, Release):  # ranks still wait for this one's failed command
            release_process_group(command)
            continue
        if isinstance(command, Answer):  # for a debugger that has ended
            continue
        if _interrupted_before_start(channel, command.cell):
            failure = failure_event(channel.rank, KeyboardInterrupt())
            done, stopped = CellDone(channel.rank, command.cell, failure=failure), True
        else:
            done, stopped = _outcome(channel, command, space)
        if stopped:
            interrupted = command.cell
        send_flushed(channel, dataclasses.replace(done, at=time.time()))  # when it ended
