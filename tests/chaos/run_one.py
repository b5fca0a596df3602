"""Run chaos scenarios by seed from a shell: ``python tests/chaos/run_one.py SEED [STYLE FAULT]``
prints each invariant it broke (nothing: it held them all)."""

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
    style, fault = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else (None, None)
    scenario = draw(seed, style, fault)
    with tempfile.TemporaryDirectory() as folder:
        outcome = run_scenario(scenario, Path(folder))
    print(scenario, f"(ended {outcome.seconds_to_end})")
    for invariant, seen in outcome.broken.items():
        print(f"  broke {invariant}: {seen}")


if __name__ == "__main__":
    main()
