"""The Ray lane's tests reach the test machines of ``tests/multiproc`` and the chaos campaign of
``tests/chaos`` (its ``ray`` style runs here), and share one Ray cluster for the session (about
6 s to start)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1] / "multiproc"),
    str(Path(__file__).resolve().parents[1] / "chaos"),
    str(Path(__file__).resolve().parents[1]),
]

from ray_cluster import RayCluster, require_ray, require_ray_cluster  # noqa: E402


@pytest.fixture(autouse=True)
def ray_installed() -> None:
    """Every test here needs Ray: skipped outside the Ray lane where it is missing."""
    require_ray()


@pytest.fixture(scope="session")
def ray_cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[RayCluster]:
    """Two Ray nodes, ``rayhead`` and ``raynode1``, for the whole session."""
    require_ray_cluster()
    finalizers: list = []
    try:
        yield RayCluster(tmp_path_factory.mktemp("ray"), finalizers.append)
    finally:  # every one runs, as pytest runs finalizers; the first failure is raised
        failures: list[BaseException] = []
        for finalizer in reversed(finalizers):
            try:
                finalizer()
            except BaseException as failure:  # noqa: BLE001 - raised below, once all ran
                failures.append(failure)
        if failures:
            raise failures[0]
