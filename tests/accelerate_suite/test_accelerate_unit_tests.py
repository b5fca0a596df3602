"""Accelerate's unit tests on nb_accel: each file runs once on Accelerate and once, imports
swapped, on nb_accel; every test that passes on Accelerate must pass on nb_accel."""

from __future__ import annotations

import pytest
from conftest import SUITE, Suite
from exclusions import reason_excluded
from suite_runs import UnitResult, run_unit_tests


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per test of each unit-test file."""
    if "unit_test" not in metafunc.fixturenames:
        return
    suite = metafunc.config.stash[SUITE]
    params = [
        pytest.param((name, test_id), id=f"{name}::{test_id}")
        for name, ids in suite.unit_ids.items()
        for test_id in ids
    ]
    metafunc.parametrize("unit_test", params)


def _results(suite: Suite, side: str, name: str) -> dict[str, UnitResult]:
    if (side, name) not in suite.unit_results:
        path = suite.originals[name] if side == "accelerate" else suite.twins[name]
        suite.unit_results[side, name] = run_unit_tests(path)
    return suite.unit_results[side, name]


@pytest.mark.timeout(1800)
def test_unit_test(unit_test: tuple[str, str], suite: Suite) -> None:
    name, test_id = unit_test
    reason = reason_excluded(f"{name}: {test_id}")
    if reason:
        pytest.skip(f"{name}::{test_id} reads Accelerate's internals: {reason}")
    baseline = _results(suite, "accelerate", name).get(test_id)
    if baseline is None or baseline.outcome != "passed":
        why = baseline.message[-1500:] if baseline else "it did not run"
        pytest.skip(f"{name}::{test_id} does not pass on Accelerate itself ({why})")
    ours = _results(suite, "nb_accel", name).get(test_id)
    assert ours is not None, f"{test_id} did not run on nb_accel"
    assert ours.outcome == "passed", ours.message
