"""The forwarder of a worker the kernel did not start itself (multi-node, XLA): what the worker
writes to its file descriptors arrives as its rank's output events, also the words it wrote just
before it aborted."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection

from nb_accel._messages import Output, decode
from nb_accel.worker.process.fd_forwarder import forward_file_descriptors


def worker_that_aborts(sender: Connection) -> None:
    forward_file_descriptors(sender, 3)
    sender.close()  # the forwarder's own now
    libc = ctypes.CDLL(None)
    libc.printf(b"printf from C, no newline yet ")
    libc.fflush(None)
    subprocess.run([sys.executable, "-c", "print('a program it started')"], check=True)
    os.write(1, b"and the rest of the line\n")
    os.write(2, b"last words before the abort\n")
    os.abort()


def _events_until_the_end(reader: Connection) -> list[Output]:
    events = []
    while reader.poll(60):
        try:
            event = decode(reader.recv_bytes())
        except EOFError:  # the worker and its forwarder are both gone
            return events
        assert isinstance(event, Output)
        events.append(event)
    raise AssertionError("the forwarder did not finish")


def test_a_forwarder_sends_the_workers_lines_even_after_it_aborted() -> None:
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    worker = context.Process(target=worker_that_aborts, args=(writer,))
    worker.start()
    writer.close()
    try:
        events = _events_until_the_end(reader)
    finally:
        worker.join(60)
        reader.close()
    assert worker.exitcode == -signal.SIGABRT
    assert {event.rank for event in events} == {3}
    out = "".join(e.text for e in events if e.stream == "stdout")
    err = "".join(e.text for e in events if e.stream == "stderr")
    assert out.splitlines() == [
        "printf from C, no newline yet a program it started",
        "and the rest of the line",
    ]
    assert err.startswith("last words before the abort\n")
