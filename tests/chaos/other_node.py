"""Node 1 of the chaos campaign's ``nodes`` style, run on its own machine (a network namespace)
as a user runs the same launch on a second machine: ``python other_node.py PLAN OPTIONS``, the
plan and the launch's options as JSON. It defines the campaign's training function as the
notebook does, launches its share (rank 1), prints the result or the error it ended in, and
exits (1 after an error). Its standard input answers a debugger's prompt (``c``)."""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from notebook_code import FUNCTIONS, TIMEOUT_S


def main() -> None:
    """Launch node 1's share of the plan the command line gives."""
    plan, options = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, when it hangs
    # its user's interrupt raises KeyboardInterrupt, as in a kernel, also when the campaign was
    # started with SIGINT ignored (a shell's background job, which Python leaves ignored in
    # the processes it starts: node 1 heard no interrupt until its launch's workers started)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # as node 0's kernel has (the campaign's LIFELONG): the workers forked here do not import
    # it first thing (the optimizer does), which on a loaded machine took node 1's rank more
    # than the 4 s timeout longer than node 0's to reach its first collective
    import torch._dynamo  # noqa: F401

    exec(FUNCTIONS, globals())  # the notebook's cell, as the user wrote it
    launch = globals()["notebook_launcher"]
    try:
        result = launch(
            globals()["chaos_train"], args=(plan,), timeout=TIMEOUT_S, num_processes=1, **options
        )
    except BaseException as error:  # noqa: BLE001 - said, as a notebook shows it
        print(f"node 1 ended in {type(error).__name__}: {error}", flush=True)
        sys.exit(1)
    print(f"node 1's results: {result}", flush=True)


if __name__ == "__main__":
    main()
