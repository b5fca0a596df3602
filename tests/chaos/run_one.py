"""Run chaos scenarios by seed from a shell: ``python tests/chaos/run_one.py SEED [STYLE
[FAULT]]`` prints each invariant it broke (nothing: it held them all). What is not given is
drawn from the seed as the soak draws it (``benchmarks/chaos.py`` says the command for each
scenario that broke an invariant)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the kernel driver
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multiproc"))  # the SSH hosts
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ray"))  # the Ray cluster

from campaign import run_scenario
from scenarios import draw


def main() -> None:
    """Run the scenario the command line names."""
    seed = int(sys.argv[1])
    style = sys.argv[2] if len(sys.argv) > 2 else None
    fault = sys.argv[3] if len(sys.argv) > 3 else None
    scenario = draw(seed, style, fault)
    with tempfile.TemporaryDirectory() as folder:
        outcome = run_scenario(scenario, Path(folder))
    print(scenario, f"(ended {outcome.seconds_to_end})")
    print("  time by phase:", ", ".join(f"{k} {v:.1f} s" for k, v in outcome.phases.items()))
    for invariant, seen in outcome.broken.items():
        print(f"  broke {invariant}: {seen}")


if __name__ == "__main__":
    main()
