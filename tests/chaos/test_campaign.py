"""The chaos campaign's fixed scenarios: every style of running ranks with every fault, once
each, in a real kernel; after each, every invariant of :mod:`campaign` must hold. The scenarios
of one style run in one kernel, one after the other (a scenario that kills its kernel, or fills
a small /dev/shm of its own, gets one of its own), as a user's notebook meets one fault after
another; what the kernel left once it shut down is checked after the style's last scenario.
The scenarios that once found a bug run each in a fresh kernel. A scenario is reproduced alone
(in a fresh kernel) with ``python tests/chaos/run_one.py SEED STYLE FAULT``; many drawn at
random run in ``benchmarks/chaos.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from campaign import HeldKernel, KernelSession, kernel_session, run_scenario
from scenarios import FOUND, KNOWN, OWN_KERNEL, Scenario, covering_seeds

pytestmark = pytest.mark.chaos

#: The covering scenarios in style order, each with whether it is its style's last that runs.
_SCENARIOS = covering_seeds()


def _known(scenario: Scenario) -> str | None:
    return KNOWN.get((scenario.style, scenario.fault, scenario.rank))


_RUN = [scenario for scenario in _SCENARIOS if _known(scenario) is None]
_LAST = {
    scenario.seed
    for index, scenario in enumerate(_RUN)
    if index + 1 == len(_RUN) or _RUN[index + 1].style != scenario.style
}
COVERING = [
    pytest.param(
        scenario,
        scenario.seed in _LAST,
        id=f"{scenario.style}-{scenario.fault}",
        marks=[  # a known bug's scenario: run alone, or in the soak
            pytest.mark.xfail(run=False, reason=reason)
            for reason in [_known(scenario)]
            if reason is not None
        ],
    )
    for scenario in _SCENARIOS
]


class StyleKernels:
    """The kernel the current style's scenarios share; a new one for the next style, or after
    a scenario broke an invariant (what broke may spoil the next)."""

    def __init__(self, folders: pytest.TempPathFactory) -> None:
        self._folders = folders
        self._style = ""
        self._held = HeldKernel()

    def session(self, scenario: Scenario) -> KernelSession | None:
        """The kernel for ``scenario`` (``None``: it needs one of its own, which it kills)."""
        if scenario.fault in OWN_KERNEL:
            return None
        if self._held.session is None or self._style != scenario.style:
            folder = self._folders.mktemp(f"kernel-{scenario.style}")
            self._held.hold(kernel_session(folder, scenario.style))
            self._style = scenario.style
        return self._held.session

    def close(self) -> list[str]:
        """Shut the kernel down; what it left."""
        return self._held.close()


@pytest.fixture(scope="module")
def style_kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StyleKernels]:
    shared = StyleKernels(tmp_path_factory)
    try:
        yield shared
    finally:
        shared.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("scenario", "last"),
    COVERING,
)
def test_every_invariant_holds(
    scenario: Scenario, last: bool, style_kernels: StyleKernels, tmp_path: Path
) -> None:
    outcome = run_scenario(scenario, tmp_path, style_kernels.session(scenario))
    broken = dict(outcome.broken)
    if broken or last:
        for left in style_kernels.close():
            broken.setdefault("nothing left", f"the {scenario.style} kernel, shut down: {left}")
    said = "\n".join(f"{invariant}: {seen}" for invariant, seen in broken.items())
    assert not broken, f"{scenario} broke:\n{said}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", FOUND, ids=lambda s: f"seed-{s.seed}-{s.style}-{s.fault}")
def test_a_scenario_that_found_a_bug_holds_every_invariant(
    scenario: Scenario, tmp_path: Path
) -> None:
    outcome = run_scenario(scenario, tmp_path)
    said = "\n".join(f"{invariant}: {seen}" for invariant, seen in outcome.broken.items())
    assert not outcome.broken, f"{scenario} broke:\n{said}"
