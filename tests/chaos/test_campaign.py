"""The chaos campaign's fixed scenarios: every style of running ranks with every fault, once
each, and the scenarios that once found a bug, in a real kernel; after each, every invariant
of :mod:`campaign` must hold. The scenarios of one style run in one kernel, one after the other
(a scenario that kills its kernel, or fills a small /dev/shm of its own, gets one of its own),
as a user's notebook meets one fault after another, the kept seeds last; what the kernel left
once it shut down is checked after the style's last scenario. A scenario is reproduced alone
(in a fresh kernel) with ``python tests/chaos/run_one.py SEED STYLE FAULT``; many drawn at
random run in ``benchmarks/chaos.py``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from campaign import StyleKernels, run_scenario
from notebook_code import plan_of
from other_node_peer import SCRIPT as OTHER_NODE
from ports import free_port
from scenarios import FOUND, KNOWN, STYLES, Scenario, covering_seeds

pytestmark = pytest.mark.chaos


def _known(scenario: Scenario) -> str | None:
    return KNOWN.get((scenario.style, scenario.fault, scenario.rank))


#: The scenarios in style order (the kept seeds after their style's covering ones), each with
#: its test's id.
_SCENARIOS = [(scenario, f"{scenario.style}-{scenario.fault}") for scenario in covering_seeds()] + [
    (scenario, f"seed-{scenario.seed}-{scenario.style}-{scenario.fault}") for scenario in FOUND
]
_SCENARIOS.sort(key=lambda pair: STYLES.index(pair[0].style))  # stable: covering ones first
_RUN = [scenario for scenario, _ in _SCENARIOS if _known(scenario) is None]
#: The scenarios that are their style's last to run: the style's kernel closes after them.
_LAST = {
    id(scenario)
    for index, scenario in enumerate(_RUN)
    if index + 1 == len(_RUN) or _RUN[index + 1].style != scenario.style
}
SCENARIOS = [
    pytest.param(
        scenario,
        id(scenario) in _LAST,
        id=name,
        marks=[  # a known bug's scenario: run alone, or in the soak
            pytest.mark.xfail(run=False, reason=reason)
            for reason in [_known(scenario)]
            if reason is not None
        ],
    )
    for scenario, name in _SCENARIOS
]


@pytest.fixture(scope="module")
def style_kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StyleKernels]:
    shared = StyleKernels(tmp_path_factory.mktemp)
    try:
        yield shared
    finally:
        shared.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("scenario", "last"), SCENARIOS)
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


@pytest.mark.timeout(120)
def test_node_1_hears_its_user_s_interrupt_when_the_campaign_runs_with_sigint_ignored(
    tmp_path: Path,
) -> None:
    """The ``nodes`` style's node 1 waits for a node 0 that never comes; its user's interrupt
    ends it, as a kernel's would, also when the campaign was started with SIGINT ignored (a
    shell's background job, as a soak often is: Python leaves it ignored in the processes it
    starts, and node 1 ran on, seeds 5097 and 6111)."""
    plan = plan_of(None, str(tmp_path / "marks"), str(tmp_path / "checkpoints"))
    options = {"num_nodes": 2, "node_rank": 1, "rdzv_endpoint": f"127.0.0.1:{free_port()}"}
    command = [sys.executable, str(OTHER_NODE), json.dumps(plan), json.dumps(options)]
    process = subprocess.Popen(  # started as a shell starts a background job: SIGINT ignored
        ["bash", "-c", 'trap "" INT; exec "$@"', "node1", *command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    try:
        seen = b""
        while b"Launching" not in seen:  # its launch waits for node 0's store now
            line = process.stdout.readline()
            assert line, f"node 1 ended before its launch: {seen!r}"
            seen += line
        process.send_signal(signal.SIGINT)
        said, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert b"node 1 ended in KeyboardInterrupt" in said, seen + said
