"""A soak of the chaos campaign: many scenarios drawn at random (each from its seed), each run in
a real kernel, the invariants checked after each (``tests/chaos/campaign.py``).

The scenarios of a style share a kernel, one after the other in the order of their seeds, as
a user's notebook meets one fault after another and as ``make test-chaos`` runs them (a
scenario that kills its kernel or fills a small ``/dev/shm`` of its own gets a kernel of its
own; after a scenario broke an invariant the style starts a new kernel; what a kernel left once
shut down counts against the scenario before). ``--fresh-kernels`` gives each scenario a kernel
of its own. ``--shards`` runs the campaign's shards at once, as ``make test-chaos`` does
(``tests/chaos/scenarios.py`` ``SHARDS``: each with styles on this machine and on other
machines), each in a process of its own; ``--shard NAME`` runs one.

It reports how many scenarios ran per style and per fault; per invariant, how many broke it
(the target is 0 for each) and the seeds that did, each reproduced alone by
``python tests/chaos/run_one.py SEED`` (``SEED STYLE`` after ``--styles``: the command is
said with each); per fault, the slowest time from the fault (or the interrupt) to the end of
its cell, against its bound; and by style, where the time went (the phases of
``campaign.PHASES``). ``--covering`` runs the covering set of ``make test-chaos`` instead of
drawn scenarios: where that time goes.

Run from the repository root::

    .venv/bin/python benchmarks/chaos.py --scenarios 500 --first-seed 1000
"""

from __future__ import annotations

import argparse
import collections
import pickle
import subprocess
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

from campaign import INVARIANTS, PHASES, Outcome, StyleKernels, bound_of, run_scenario
from scenarios import SHARDS, STYLES, Scenario, covering_seeds, draw


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
    return "\n".join([*lines, "", *_phases_table(outcomes)])


def _phases_table(outcomes: list[Outcome]) -> list[str]:
    """Where the scenarios' time went: by style, the seconds of each phase in all."""
    by_style: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for outcome in outcomes:
        by_style[outcome.scenario.style].update(outcome.phases)
    lines = ["| style | " + " | ".join(PHASES) + " | all (s) |", "|---" * (len(PHASES) + 2) + "|"]
    for style, phases in sorted(by_style.items(), key=lambda item: STYLES.index(item[0])):
        cells = " | ".join(f"{phases[phase]:.0f}" for phase in PHASES)
        lines.append(f"| {style} | {cells} | {sum(phases.values()):.0f} |")
    return lines


def _run_all(scenarios: list[Scenario], root: Path, fresh: bool, styled: bool) -> list[Outcome]:
    """Run ``scenarios`` under ``root``: by style, in the style's shared kernel (unless
    ``fresh``); each outcome said on stderr as it comes (with the command that runs a broken
    one again: its seed, and its style where ``styled``, the styles given)."""
    kernels = StyleKernels(lambda name: Path(tempfile.mkdtemp(prefix=name, dir=root)))
    outcomes: list[Outcome] = []
    try:
        for index, scenario in enumerate(scenarios):
            folder = Path(tempfile.mkdtemp(prefix=f"seed-{scenario.seed}-", dir=root))
            outcome = run_scenario(scenario, folder, None if fresh else kernels.session(scenario))
            following = scenarios[index + 1] if index + 1 < len(scenarios) else None
            if outcome.broken or following is None or following.style != scenario.style:
                for left in kernels.close():
                    outcome.fail("nothing left", f"the {scenario.style} kernel, shut down: {left}")
            outcomes.append(outcome)
            state = "ok" if not outcome.broken else "BROKE " + ", ".join(outcome.broken)
            if outcome.seconds_to_end is not None:
                state += f" ({outcome.seconds_to_end:.1f} s from the fault to the end)"
            print(f"{scenario}: {state}", file=sys.stderr, flush=True)
            for invariant, seen in outcome.broken.items():
                print(f"    {invariant}: {seen}", file=sys.stderr, flush=True)
            if outcome.broken:  # drawn from its seed alone, or with its style given
                again = f"{scenario.seed} {scenario.style}" if styled else f"{scenario.seed}"
                print(f"    again: tests/chaos/run_one.py {again}", file=sys.stderr, flush=True)
    finally:
        kernels.close()
    return outcomes


def main() -> None:
    """Run the soak the command line asks for and print its report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=24, help="how many to run")
    parser.add_argument("--first-seed", type=int, default=1000, help="the first scenario's seed")
    parser.add_argument(
        "--fresh-kernels", action="store_true", help="a kernel of its own for each scenario"
    )
    parser.add_argument(
        "--styles",
        default="",
        help="only these styles, comma-separated (each seed takes the next in turn)",
    )
    parser.add_argument(
        "--covering",
        action="store_true",
        help="the covering set of make test-chaos (every style with every fault), not drawn",
    )
    parser.add_argument("--shards", action="store_true", help="the shards at once")
    parser.add_argument("--shard", choices=sorted(SHARDS), help="only this shard's styles")
    parser.add_argument("--outcomes", help=argparse.SUPPRESS)  # a shard's, for --shards
    args = parser.parse_args()
    styles = [style for style in args.styles.split(",") if style]
    unknown = sorted(set(styles) - set(STYLES))
    if unknown:
        parser.error(f"no style {', '.join(unknown)}: the styles are {', '.join(STYLES)}")
    started = time.monotonic()
    if args.shards:
        outcomes = _in_shards(sys.argv[1:])
    else:
        seeds = range(args.first_seed, args.first_seed + args.scenarios)
        drawn = [draw(seed, styles[seed % len(styles)] if styles else None) for seed in seeds]
        if args.covering:
            wanted = styles or STYLES
            drawn = [scenario for scenario in covering_seeds() if scenario.style in wanted]
        if args.shard:
            drawn = [scenario for scenario in drawn if scenario.style in SHARDS[args.shard]]
        in_order = sorted(drawn, key=lambda scenario: (STYLES.index(scenario.style), scenario.seed))
        with tempfile.TemporaryDirectory() as root:
            outcomes = _run_all(in_order, Path(root), args.fresh_kernels, bool(styles))
    if args.outcomes:
        Path(args.outcomes).write_bytes(pickle.dumps(outcomes))
        return
    print(report(outcomes, time.monotonic() - started))


def _in_shards(arguments: list[str]) -> list[Outcome]:
    """Each shard's scenarios of the soak ``arguments`` ask for, run at once in a process of
    its own (this script, told its shard); their outcomes together."""
    others = [argument for argument in arguments if argument != "--shards"]
    with tempfile.TemporaryDirectory() as root:
        runs = {
            shard: subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    *others,
                    "--shard",
                    shard,
                    "--outcomes",
                    str(Path(root, shard)),
                ]
            )
            for shard in SHARDS
        }
        try:
            codes = {shard: run.wait() for shard, run in runs.items()}
        finally:
            for run in runs.values():
                if run.poll() is None:
                    run.terminate()
                    run.wait()
        failed = [f"{shard} (exit code {code})" for shard, code in codes.items() if code]
        if failed:
            raise SystemExit(f"the soak's shards {', '.join(failed)} did not finish")
        return [o for shard in SHARDS for o in pickle.loads(Path(root, shard).read_bytes())]


if __name__ == "__main__":
    main()
