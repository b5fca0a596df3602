"""The chaos campaign's ``ray`` style (``tests/chaos``): every fault that can happen on a Ray
cluster, once each, in a real kernel on the head node (as a notebook there runs: it connects
with ``ray.init(address="auto")``), a rank on each node; after each, every invariant of the
campaign must hold, Ray's side included (no node actor, node process or worker left on either
node). The scenarios share one kernel, one after the other, as a user's notebook meets one fault
after another (a scenario that kills its kernel gets one of its own); what the kernel left
once it shut down is checked after the last."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from campaign import HeldKernel, KernelSession, kernel_session, run_scenario
from ray_cluster import RayCluster
from scenarios import OWN_KERNEL, Scenario, covering_seeds

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

SCENARIOS = covering_seeds(("ray",))
_SHARED = [scenario for scenario in SCENARIOS if scenario.fault not in OWN_KERNEL]
_folders = itertools.count()


class SharedKernel:
    """The kernel the scenarios share, on the cluster's head; a new one after a scenario broke
    an invariant (what broke may spoil the next)."""

    def __init__(self, cluster: RayCluster) -> None:
        self._cluster = cluster
        self._held = HeldKernel()

    def session(self) -> KernelSession:
        """The shared kernel, started where there is none."""
        if self._held.session is None:
            folder = _folder(self._cluster, "kernel")
            return self._held.hold(kernel_session(folder, "ray", cluster=self._cluster))
        return self._held.session

    def close(self) -> list[str]:
        """Shut the kernel down; what it left."""
        return self._held.close()


def _folder(cluster: RayCluster, name: str) -> Path:
    """A new folder the head and the node both reach (the kernels' folder, whose processes
    are the kernels')."""
    folder = cluster.kernels / f"chaos-{name}-{next(_folders)}"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def shared_kernel(ray_cluster: RayCluster) -> Iterator[SharedKernel]:
    shared = SharedKernel(ray_cluster)
    try:
        yield shared
    finally:
        shared.close()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"ray-{s.fault}")
def test_every_invariant_holds_on_ray(
    scenario: Scenario, shared_kernel: SharedKernel, ray_cluster: RayCluster
) -> None:
    folder = _folder(ray_cluster, "scenario")
    if scenario.fault in OWN_KERNEL:
        outcome = run_scenario(scenario, folder, cluster=ray_cluster)
    else:
        outcome = run_scenario(scenario, folder, shared_kernel.session())
    broken = dict(outcome.broken)
    if broken or scenario == _SHARED[-1]:
        for left in shared_kernel.close():
            broken.setdefault("nothing left", f"the ray kernel, shut down: {left}")
    said = "\n".join(f"{invariant}: {seen}" for invariant, seen in broken.items())
    assert not broken, f"{scenario} broke:\n{said}"
