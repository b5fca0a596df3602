"""Accelerate's multi-process test scripts on nb_accel: one launch of two processes per test
call, each compared with the same call on Accelerate's own two-process CPU run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SUITE, Suite
from exclusions import reason_excluded
from suite_runs import run_on_accelerate, run_on_nb_accel
from suite_sources import SCRIPTS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per call each script's ``main()`` makes on Accelerate."""
    if "script_call" not in metafunc.fixturenames:
        return
    suite = metafunc.config.stash[SUITE]
    params = []
    for name in SCRIPTS:
        listing = suite.calls[name]
        if not listing.passed:
            params.append(pytest.param((name, -1, listing.output), id=f"{name}: listing"))
        for number, call in enumerate(listing.calls):
            params.append(pytest.param((name, number, call), id=f"{name}[{number}] {call}"))
    metafunc.parametrize("script_call", params)


def _outcome_on_nb_accel(suite: Suite, name: str, number: int) -> str:
    """How a test call that fails on Accelerate goes on nb_accel, for the skip's reason."""
    try:
        run_on_nb_accel(suite.twins[name], number)
    except Exception as error:  # noqa: BLE001 - reported, not raised: the test is skipped
        return f"fails on nb_accel too: {type(error).__name__}: {str(error)[:300]}"
    return "passes on nb_accel"


@pytest.mark.timeout(900)
def test_script_call(script_call: tuple[str, int, str], suite: Suite, tmp_path: Path) -> None:
    name, number, call = script_call
    if number < 0:
        pytest.fail(f"{name} does not list its tests on Accelerate itself:\n{call}")
    reason = reason_excluded(f"{name}: {call.split('(')[0]}")
    if reason:
        pytest.skip(f"{name}[{number}] {call} reads Accelerate's internals: {reason}")
    baseline = run_on_accelerate(suite.originals[name], number, tmp_path)
    if not baseline.passed:
        pytest.skip(
            f"{name}[{number}] {call} fails on Accelerate's own CPU run "
            f"({_outcome_on_nb_accel(suite, name, number)}):\n"
            f"{baseline.output[-1500:]}"
        )
    made = run_on_nb_accel(suite.twins[name], number)
    for rank, calls in enumerate(made):
        assert calls == baseline.calls, f"rank {rank}: main() made other test calls on nb_accel"
