"""The chaos campaign's fixed scenarios: every style of running ranks with every fault, once
each, in a real kernel; after each, every invariant of :mod:`campaign` must hold. A scenario
is reproduced alone with ``python tests/chaos/run_one.py SEED STYLE FAULT``; many drawn at
random run in ``benchmarks/chaos.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from campaign import run_scenario
from scenarios import FOUND, Scenario, covering_seeds

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", covering_seeds(), ids=lambda s: f"{s.style}-{s.fault}")
def test_every_invariant_holds(scenario: Scenario, tmp_path: Path) -> None:
    outcome = run_scenario(scenario, tmp_path)
    said = "\n".join(f"{invariant}: {seen}" for invariant, seen in outcome.broken.items())
    assert not outcome.broken, f"{scenario} broke:\n{said}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", FOUND, ids=lambda s: f"seed-{s.seed}-{s.style}-{s.fault}")
def test_a_scenario_that_found_a_bug_holds_every_invariant(
    scenario: Scenario, tmp_path: Path
) -> None:
    outcome = run_scenario(scenario, tmp_path)
    said = "\n".join(f"{invariant}: {seen}" for invariant, seen in outcome.broken.items())
    assert not outcome.broken, f"{scenario} broke:\n{said}"
