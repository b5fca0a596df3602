"""A soak of the chaos campaign: many scenarios drawn at random (each from its seed), each run in
a real kernel, the invariants checked after each (``tests/chaos/campaign.py``).

It reports how many scenarios ran per style and per fault; per invariant, how many broke it
(the target is 0 for each) and the seeds that did, each reproduced alone by
``python tests/chaos/run_one.py SEED``; and per fault, the slowest time from the fault (or the
interrupt) to the end of its cell, against its bound.

Run from the repository root::

    .venv/bin/python benchmarks/chaos.py --scenarios 500 --first-seed 1000
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the kernel driver
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))
sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "tests" / "multiproc")
)  # the SSH hosts
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ray"))  # the Ray cluster

from campaign import INVARIANTS, Outcome, bound_of, run_scenario
from scenarios import draw


def report(outcomes: list[Outcome], took_s: float) -> str:
    """The soak's tables, as Markdown."""
    lines = [f"{len(outcomes)} scenarios in {took_s / 60:.1f} min", ""]
    for what, key in (("style", "style"), ("fault", "fault")):
        counts = collections.Counter(getattr(o.scenario, key) for o in outcomes)
        lines += [f"| {what} | scenarios |", "|---|---|"]
        lines += [f"| {name} | {count} |" for name, count in sorted(counts.items())]
        lines.append("")
    lines += ["| invariant | broken | seeds |", "|---|---|---|"]
    for invariant in INVARIANTS:
        seeds = [o.scenario.seed for o in outcomes if invariant in o.broken]
        lines.append(f"| {invariant} | {len(seeds)} | {', '.join(map(str, seeds)) or '-'} |")
    lines += ["", "| fault | slowest to the end (s) | bound (s) |", "|---|---|---|"]
    slowest: dict[str, float] = {}
    for outcome in outcomes:  # a max_restarts run trains again after its fault: left out
        if outcome.seconds_to_end is not None and outcome.scenario.style != "restarts":
            fault = outcome.scenario.fault
            slowest[fault] = max(slowest.get(fault, 0.0), outcome.seconds_to_end)
    for fault, seconds in sorted(slowest.items()):
        lines.append(f"| {fault} | {seconds:.1f} | {bound_of(fault):.0f} |")
    return "\n".join(lines)


def main() -> None:
    """Run the soak the command line asks for and print its report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=24, help="how many to run")
    parser.add_argument("--first-seed", type=int, default=1000, help="the first scenario's seed")
    args = parser.parse_args()
    outcomes: list[Outcome] = []
    started = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.scenarios):
        scenario = draw(seed)
        with tempfile.TemporaryDirectory() as folder:
            outcome = run_scenario(scenario, Path(folder))
        outcomes.append(outcome)
        state = "ok" if not outcome.broken else "BROKE " + ", ".join(outcome.broken)
        if outcome.seconds_to_end is not None:
            state += f" ({outcome.seconds_to_end:.1f} s from the fault to the end)"
        print(f"{scenario}: {state}", file=sys.stderr, flush=True)
    print(report(outcomes, time.monotonic() - started))


if __name__ == "__main__":
    main()
