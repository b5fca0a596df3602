"""Launch, step and ``%%distributed`` benchmarks of two versions of nb_accel, in the same run.

Run from the repository root::

    .venv/bin/python benchmarks/before_after.py --baseline <git revision>

The baseline's package is exported (``git archive``) to a temporary folder; the working tree is
the other contender. Both are measured with this tree's ``benchmarks/launch.py``,
``benchmarks/step.py``, ``benchmarks/magic.py`` (an empty cell through a real kernel, whose
pool's workers inherit the path), ``benchmarks/late_rank.py`` (a rank late in its own code,
in each way of running ranks) and ``benchmarks/warm.py`` (a warm launch and its floor), the
same measuring code, each run in a fresh interpreter whose ``PYTHONPATH`` puts one version
first. The versions alternate (ABBA order) for ``--repeats``
rounds, so a slow spell of the machine falls on both; the table gives the median of each
figure over the rounds, after / before, and each version's spread (lowest to highest round).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_NB = r"^nb_accel\.notebook_launcher\s+"
#: What is read off each benchmark's output: a label and a pattern with one number.
FIGURES = {
    "launch": [
        ("launch + teardown, median s", _NB + r"([\d.]+)\s+[\d.]+\s+[\d.]+x"),
        ("worker exception raised, median s", _NB + r"([\d.]+)\s+[\d.]+\s+[\d.]+$"),
        ("launch vs floor (same run)", r"^target nb_accel <= [\d.]+x floor: ([\d.]+)x"),
    ],
    "step": [
        ("training step, median ms", r"^nb_accel\.Accelerator\s+([\d.]+)\s+[\d.]+x"),
        ("step vs hand-written DDP (paired)", r"^nb_accel\.Accelerator\s+[\d.]+\s+([\d.]+)x"),
    ],
    "magic": [
        ("empty %%distributed cell, median ms", r"^\s+%%distributed cell\s+([\d.]+)\s+[\d.]+$"),
        ("its overhead on a plain cell, ms", r"^\s+overhead: ([\d.-]+) ms median"),
    ],
    "warm": [
        (
            "warm launch, back to back, ms",
            r"^warm launch, back to back \(no fork in between\)\s+([\d.]+)",
        ),
        (
            "its floor: an empty command, ms",
            r"^\s+floor: an empty command to the same workers\s+([\d.]+)",
        ),
    ],
    "late_rank": [
        (f"late rank, {style}: to the error, s", rf"^{style}\s+([\d.]+)\s")
        for style in ("cold launch", "warm launch", "pool cell", "agent launch")
    ],
}
COMMANDS = {
    "launch": ["benchmarks/launch.py", "--no-accelerate", "--rounds", "10", "--failure-rounds=6"],
    "step": ["benchmarks/step.py", "--rounds", "20", "--runs", "1"],
    "magic": ["benchmarks/magic.py", "--rounds", "60", "--warmup", "10", "--no-load"],
    "late_rank": ["benchmarks/late_rank.py", "--rounds", "2"],
    "warm": ["benchmarks/warm.py", "--rounds", "30", "--runs", "1", "--huge-gb", "0"],
}


def export(revision: str, folder: Path) -> Path:
    """The package of ``revision``, unpacked into ``folder``; returns the folder to import from."""
    archive = subprocess.run(
        ["git", "archive", revision, "nb_accel"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def measure(benchmark: str, package_root: Path) -> dict[str, float]:
    """Run one benchmark against the package under ``package_root``; its figures."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    done = subprocess.run(
        [sys.executable, *COMMANDS[benchmark]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{benchmark} failed against {package_root}:\n{done.stdout}{done.stderr}"
        )
    figures: dict[str, float] = {}
    for label, pattern in FIGURES[benchmark]:
        match = re.search(pattern, done.stdout, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"{benchmark}: no {label!r} in its output:\n{done.stdout}")
        figures[label] = float(match.group(1))
    return figures


def abba(repeats: int) -> Iterator[tuple[str, ...]]:
    """The order of the two versions in each round: before/after, then after/before."""
    for index in range(repeats):
        yield ("before", "after") if index % 2 == 0 else ("after", "before")


def main() -> None:
    """Measure both versions and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--repeats", type=int, default=4, help="rounds of each benchmark")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(FIGURES), default=sorted(FIGURES), help="benchmarks"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nb_accel-baseline-") as folder:
        trees = {"before": export(args.baseline, Path(folder)), "after": ROOT}
        seen: dict[tuple[str, str], list[float]] = {}
        for benchmark in args.only:
            for order in abba(args.repeats):
                for version in order:
                    for label, value in measure(benchmark, trees[version]).items():
                        seen.setdefault((label, version), []).append(value)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(
        f"before: {args.baseline}; after: the working tree at {head}; "
        f"{args.repeats} rounds each, ABBA order, medians over rounds"
    )
    labels = [label for name in args.only for label, _ in FIGURES[name]]
    width = max(len(label) for label in labels)
    print(
        f"{'figure':<{width}}  {'before':>8}  {'after':>8}  {'after/before':>12}  "
        f"{'before min-max':>15}  {'after min-max':>15}"
    )
    for label in labels:
        runs = {version: seen[(label, version)] for version in ("before", "after")}
        before, after = (statistics.median(runs[v]) for v in ("before", "after"))
        ratio = f"{after / before:11.3f}x" if before > 0 else f"{'-':>12}"
        spread = "  ".join(f"{min(runs[v]):7.3f}-{max(runs[v]):<7.3f}" for v in runs)
        print(f"{label:<{width}}  {before:8.3f}  {after:8.3f}  {ratio}  {spread}")


if __name__ == "__main__":
    main()
