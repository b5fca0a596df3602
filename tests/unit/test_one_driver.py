"""Every way of running ranks reaches its outcome through the one driver: each built-in launch
backend and the pool run their ranks' command with ``RankDriver``, and only the driver gives a
verdict (``failure_outcome``) or frees the ranks still running after a failure."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import nb_accel
from nb_accel.launch.backends import BUILT_IN
from nb_accel.launch.driver.driver import RankDriver
from nb_accel.launch.launchers.backend import LaunchBackend
from nb_accel.launch.pool import WorkerPool
from nb_accel.launch.pool_ranks.interface import PoolRanks

LAUNCH = Path(nb_accel.__file__).parent / "launch"
DRIVER = LAUNCH / "driver" / "driver.py"


def _names(path: Path) -> set[str]:
    """Every name the module at ``path`` uses or imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
    return found


def _module_of(cls: type) -> Path:
    return Path(inspect.getfile(cls))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BUILT_IN, ids=lambda b: b.name)
def test_every_built_in_backend_runs_its_ranks_through_the_driver(
    backend: type[LaunchBackend],
) -> None:
    names = _names(_module_of(backend))
    # a warm launch is a command of the pool's, which runs it through the driver
    assert "RankDriver" in names or "WorkerPool" in names, backend.name
    assert "RankDriver" in _names(_module_of(WorkerPool))


@pytest.mark.timeout(60)
def test_only_the_driver_gives_a_verdict_or_frees_late_ranks() -> None:
    callers = {
        str(path.relative_to(LAUNCH))
        for path in LAUNCH.rglob("*.py")
        if path != DRIVER and {"failure_outcome", "free_late", "send_interrupts"} & _names(path)
    }
    # the verdict's own module defines it, late.py defines the freeing the driver calls
    assert callers <= {"launchers/outcome.py", "pool_ranks/late.py"}, callers


@pytest.mark.timeout(60)
def test_each_kind_of_ranks_says_whether_it_outlives_its_command() -> None:
    from nb_accel.launch.hosts.launched_ranks import LaunchedHostRanks
    from nb_accel.launch.hosts.pool_ranks import HostRanks
    from nb_accel.launch.multinode.node_ranks import NodeRanks
    from nb_accel.launch.pool_ranks.launched import LaunchedRanks
    from nb_accel.launch.pool_ranks.local import LocalRanks
    from nb_accel.launch.xla.ranks import XlaRanks

    kept = {LocalRanks: True, HostRanks: True}
    launched = {LaunchedRanks: False, LaunchedHostRanks: False, NodeRanks: False, XlaRanks: False}
    for ranks, keeps in {**kept, **launched}.items():
        assert issubclass(ranks, PoolRanks) and not ranks.__abstractmethods__, ranks
        assert ranks.keeps is keeps, ranks
    assert RankDriver.run_started is not RankDriver.run  # command 0 and the commands after
