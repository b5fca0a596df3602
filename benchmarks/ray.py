"""Launches on a Ray cluster: ``notebook_launcher(hosts="ray")`` against Ray Train's
``TorchTrainer(...).fit()``, on the same cluster, in the same run, with the same function.

Run as root from the repository root, in the Ray lane's environment with Ray Train::

    make ray-env && .venv-ray/bin/python -m pip install "ray[train]" torch==2.13.0
    .venv-ray/bin/python benchmarks/ray.py --rounds 5

The cluster is the tests' (``tests/ray/ray_cluster.py``): Ray's own ``ray start`` on two
machines (network namespaces), 2 CPUs each as Ray counts them, the kernel on the head node;
here each host name resolves to its machine's address, as Ray Train needs (with every name on
loopback, as the tests have it, its gloo group cannot connect). One kernel on the head runs
every contender, alternating them within each round:

- **cold**: time to every rank's result of a function that all-reduces one tensor, 2 ranks on
  each node. Baseline: ``TorchTrainer(fn, ScalingConfig(num_workers=4)).fit()`` of the same
  function (its worker group made and torn down by every ``fit()``, as ours is by every cold
  launch; it hands back rank 0's report only).
- **warm**: the same launch with ``reuse_workers=True`` on workers kept from the launch before.
  Baseline: one Ray call to each of four actors (two on each node) and their four answers, the
  floor of anything that reaches every rank through Ray.
- **step**: one training step of a small model under ``Accelerator`` (DDP), median over 30 steps
  after 5, in the launch on the cluster (2 nodes x 2 ranks). Baseline: the same launch on one
  of the cluster's nodes, 4 ranks there (``num_nodes=1`` is 2 ranks; this is the head's own
  4-rank launch, ``hosts="local"``). The machines share this VM's two cores: the ratio says what
  the cross-node group costs, not what a real network does.

Every figure is the median over the rounds with its spread (min to max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this file is ray.py: `import ray` must find Ray, not it
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path[:0] = [str(HERE.parent / "tests" / d) for d in ("multiproc", "ray", ".")]

from ray_cluster import RayCluster  # noqa: E402

sys.path.append(str(HERE))
from machine import run_header  # noqa: E402

KERNEL = """
import json, statistics, sys, time
import ray
import torch
import torch.distributed as dist
from nb_accel import notebook_launcher, stop_workers

from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

ROUNDS, STORAGE = (int(sys.argv[1]), sys.argv[2]) if len(sys.argv) > 2 else (0, "")


def summed():
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()


def trained():
    import ray.train
    value = torch.ones(1)
    dist.all_reduce(value)
    ray.train.report({"sum": value.item()})


def steps():
    from nb_accel import Accelerator
    accelerator = Accelerator()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    times = []
    for step in range(35):
        started = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - started)
    return statistics.median(times[5:])


@ray.remote(num_cpus=0)
class Pinged:
    def ping(self):
        return 1


def timed(call):
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def fit(round_):
    config = RunConfig(storage_path=STORAGE, name=f"fit{round_}")
    TorchTrainer(trained, scaling_config=ScalingConfig(num_workers=4), run_config=config).fit()


def main():
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    figures = {"cold": [], "fit": [], "warm": [], "ping": [], "step": [], "step_here": []}
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    actors = [
        Pinged.options(scheduling_strategy=strategy(n, soft=False)).remote() for n in nodes * 2
    ]
    ray.get([a.ping.remote() for a in actors])
    for round_ in range(ROUNDS):
        order = ["cold", "fit"] if round_ % 2 == 0 else ["fit", "cold"]
        for which in order:
            if which == "cold":
                t = timed(lambda: notebook_launcher(summed, num_processes=2, hosts="ray"))
            else:
                t = timed(lambda: fit(round_))
            figures[which].append(t)
    notebook_launcher(summed, num_processes=2, hosts="ray", reuse_workers=True, show_progress=False)
    for round_ in range(ROUNDS * 4):
        figures["warm"].append(timed(lambda: notebook_launcher(
            summed, num_processes=2, hosts="ray", reuse_workers=True, show_progress=False)))
        figures["ping"].append(timed(lambda: ray.get([a.ping.remote() for a in actors])))
    stop_workers()
    for round_ in range(ROUNDS):
        spread = notebook_launcher(steps, num_processes=2, hosts="ray", show_progress=False)
        here = notebook_launcher(steps, num_processes=4, hosts="local", show_progress=False)
        figures["step"].append(statistics.median(spread))
        figures["step_here"].append(statistics.median(here))
    print("FIGURES", json.dumps(figures), flush=True)


if __name__ == "__main__":  # workers started by forkserver import this file too
    main()
"""


def _spread(values: list[float], scale: float) -> str:
    median = statistics.median(values) * scale
    return f"{median:.3g} [{min(values) * scale:.3g}-{max(values) * scale:.3g}]"


def _ratio(ours: list[float], base: list[float]) -> str:
    ratios = [a / b for a, b in zip(ours, base, strict=False)]
    median = statistics.median(ours) / statistics.median(base)
    return f"{median:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory(prefix="nb-accel-bench-ray-") as folder:
        cleanups: list = []
        try:
            cluster = RayCluster(Path(folder), cleanups.append, loopback_names=False)
            script = cluster.kernels / "bench.py"
            script.write_text(textwrap.dedent(KERNEL))
            storage = cluster.kernels / "ray_results"
            done = subprocess.run(
                cluster.on_head([sys.executable, str(script), str(rounds), str(storage)]),
                capture_output=True,
                text=True,
                timeout=3600,
                check=False,
            )
        finally:
            for cleanup in reversed(cleanups):
                cleanup()
    lines = [line for line in done.stdout.splitlines() if line.startswith("FIGURES ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(done.stdout[-4000:] + done.stderr[-4000:])
    figures = json.loads(lines[-1].removeprefix("FIGURES "))
    import torch

    print(run_header(torch=torch.__version__), f"{rounds} rounds")
    print("| figure | nb_accel | baseline | ratio |")
    print("|---|---|---|---|")
    rows = [
        ("cold launch, 2 nodes x 2 ranks (s)", "cold", "TorchTrainer.fit()", "fit", 1.0),
        ("warm launch (ms)", "warm", "a Ray call to 4 actors", "ping", 1e3),
        (
            "training step, Accelerator + DDP (ms)",
            "step",
            "4 ranks on one machine",
            "step_here",
            1e3,
        ),
    ]
    for title, ours, baseline, base, scale in rows:
        mine, theirs = figures[ours], figures[base]
        print(
            f"| {title} | {_spread(mine, scale)} | {baseline} {_spread(theirs, scale)} "
            f"| {_ratio(mine, theirs)} |"
        )


if __name__ == "__main__":
    main()
