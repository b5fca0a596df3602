"""The chaos campaign's tests reach the test machines (SSH hosts) of ``tests/multiproc``, and
the Ray cluster of ``tests/ray`` (whose style runs in the Ray lane). ``--chaos-shard NAME``
keeps the scenarios of one shard's styles (see ``scenarios.SHARDS``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multiproc"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ray"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import SHARDS  # found through the path above


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--chaos-shard`` option."""
    parser.addoption(
        "--chaos-shard",
        choices=sorted(SHARDS),
        default=None,
        help="only the chaos scenarios of this shard's styles (tests/chaos/scenarios.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the scenarios of the other shard when ``--chaos-shard`` names one."""
    shard = config.getoption("--chaos-shard")
    if shard is None:
        return
    kept, dropped = [], []
    for item in items:
        scenario = getattr(item, "callspec", None) and item.callspec.params.get("scenario")
        if scenario is None:  # not a scenario: in the first shard only
            in_shard = shard == next(iter(SHARDS))
        else:
            in_shard = scenario.style in SHARDS[shard]
        (kept if in_shard else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
