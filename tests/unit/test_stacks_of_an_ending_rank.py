"""Asking where a rank is, as it ends: a rank that exits instead of answering (it was returning
its result when the kernel was interrupted) is not waited for, nor asked again. Found by the
chaos campaign (seed 14, a cold spawn launch interrupted at its teardown: 2 s to end, bound
2 s): the kernel waited its full wait for the stacks of ranks that had exited, twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from markers import interrupted_unless_done

from nb_accel.launch.failures.whereabouts import take_stacks
from nb_accel.worker.reporting.stacks import stack_file

pytestmark = pytest.mark.timeout(60)

#: Far longer than the test's bound: only a rank given up once it ended ends the wait.
WAIT_S = 30.0


def test_a_rank_that_exits_instead_of_answering_is_not_waited_for(tmp_path: Path) -> None:
    # a process that registered a stack file but dies of the stack signal (as an ending worker
    # whose handler is gone): it never answers
    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        Path(stack_file(str(tmp_path), 0)).write_text("rank 0\n")
        with interrupted_unless_done("the ended rank given up", 10):
            stacks = take_stacks(str(tmp_path), {0: ending.pid}, wait_s=WAIT_S)
        assert stacks == {}
        assert ending.wait(timeout=10) != 0
    finally:
        ending.kill()
        ending.wait()
