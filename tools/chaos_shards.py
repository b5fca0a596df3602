"""Run the chaos campaign's shards at once, as ``make test-chaos`` does.

Usage: python tools/chaos_shards.py [PYTEST OPTIONS]

Each shard of ``tests/chaos/scenarios.py`` (``SHARDS``: styles of about the same time, each
with styles whose ranks run on this machine and styles on other machines) runs in a pytest of
its own, all at once (:mod:`at_once`); their lines are shown as they come, each after its
shard's name. The exit code is the first nonzero of theirs (0: all passed). An interrupt
stops them all.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from at_once import run_at_once  # found through the path above
from scenarios import SHARDS


def main() -> int:
    """Run the shards; the exit code."""
    return run_at_once(
        {
            name: ["-m", "chaos", "tests/chaos", "-v", f"--chaos-shard={name}", *sys.argv[1:]]
            for name in SHARDS
        }
    )


if __name__ == "__main__":
    sys.exit(main())
