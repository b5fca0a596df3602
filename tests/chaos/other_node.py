"""Node 1 of the chaos campaign's ``nodes`` style, run on its own machine (a network namespace)
as a user runs the same launch on a second machine: ``python other_node.py PLAN OPTIONS``, the
plan and the launch's options as JSON. It defines the campaign's training function as the
notebook does, launches its share (rank 1), prints the result or the error it ended in, and
exits (1 after an error). Its standard input answers a debugger's prompt (``c``).

``python other_node.py --ready`` imports what a launch needs once and then waits: for each
request on its standard input (a JSON line: ``plan``, ``options``, ``log``, the file the run
writes its output to, and ``answers``, its standard input) it forks a node 1 that runs that
launch as the command above would, says ``started PID``, and once it ended ``ended PID
CODE`` (a negative code: the signal that ended it). A run then starts at once instead of
after an interpreter's start and torch's import, each of which, on a loaded machine, took
seconds of the other node's time at the rendezvous."""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from notebook_code import FUNCTIONS, TIMEOUT_S

#: The line that says when (``time.monotonic()``, the same clock on every machine of this
#: box) node 1 had said how its launch ended: what came after it was the process's exit.
SAID_AT = "said at "


def _prepare() -> None:
    """What node 1 has before its launch: the notebook's cell run, torch's compiler imported."""
    # as node 0's kernel has (the campaign's LIFELONG): the workers forked here do not import
    # it first thing (the optimizer does), which on a loaded machine took node 1's rank more
    # than the 4 s timeout longer than node 0's to reach its first collective
    import torch._dynamo  # noqa: F401

    exec(FUNCTIONS, globals())  # the notebook's cell, as the user wrote it


def _launch(plan: dict[str, Any], options: dict[str, Any]) -> int:
    """Node 1's share of ``plan``, said on standard output; its exit code (1: an error)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, when it hangs
    # its user's interrupt raises KeyboardInterrupt, as in a kernel, also when the campaign was
    # started with SIGINT ignored (a shell's background job, which Python leaves ignored in
    # the processes it starts: node 1 heard no interrupt until its launch's workers started)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    launch = globals()["notebook_launcher"]
    try:
        result = launch(
            globals()["chaos_train"], args=(plan,), timeout=TIMEOUT_S, num_processes=1, **options
        )
    except BaseException as error:  # noqa: BLE001 - said, as a notebook shows it
        print(f"node 1 ended in {type(error).__name__}: {error}", flush=True)
        print(f"{SAID_AT}{time.monotonic():.3f}", flush=True)  # the exit may take more time
        return 1
    print(f"node 1's results: {result}", flush=True)
    return 0


def _end_forked(code: int) -> None:
    """End a node forked by the server as multiprocessing ends the processes it forks: its
    ``atexit`` functions run, its streams flushed, without the interpreter's teardown, which
    in a fork touches (and so copies) every page of torch's modules: 1.3 s unloaded, more
    than 5 s with the campaign's shards at once (seed 11441: node 1 had said its interrupt at
    once, and then took that long to exit)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _request() -> dict[str, Any] | None:
    """The next request on standard input (read byte by byte: nothing past its line is taken
    from the pipe a forked node inherits); ``None`` once the input is closed."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            return None
        line += byte
    request: dict[str, Any] = json.loads(line)
    return request


def _serve() -> dict[str, Any]:
    """Fork a node 1 for each request; in the forked node, its request (the server itself
    exits once its input is closed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runs' interrupts are theirs
    while (request := _request()) is not None:
        answers, answering = os.pipe()
        os.write(answering, request["answers"].encode())
        os.close(answering)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the node: its input the answers, its output the log
            os.dup2(answers, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(answers)
            os.close(log)
            return request
        os.close(answers)
        os.close(log)
        os.write(1, f"started {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, f"ended {pid} {os.waitstatus_to_exitcode(status)}\n".encode())
    sys.exit(0)


def main() -> None:
    """Launch node 1's share of the plan the command line gives, or serve requests."""
    _prepare()
    if sys.argv[1:] == ["--ready"]:
        request = _serve()
        _end_forked(_launch(request["plan"], request["options"]))
    sys.exit(_launch(json.loads(sys.argv[1]), json.loads(sys.argv[2])))


if __name__ == "__main__":
    main()
