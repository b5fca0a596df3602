"""Multi-node options are checked before anything starts, with messages naming the option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import nb_accel
from nb_accel.config import Config
from nb_accel.errors import LaunchError
from nb_accel.launch.placement.nodes import NodePlan, make_node_plan
from nb_accel.launch.request import LaunchRequest
from nb_accel.launch.resolve import resolve_spec
from nb_accel.launch.spec import LaunchSpec
from nb_accel.worker.process.node_worker import global_rank


def _never_called() -> None:
    raise AssertionError("no worker may start")


def _resolved(config: Config, pool: bool = False, **options: Any) -> LaunchSpec:
    return resolve_spec(LaunchRequest(**options), pool=pool, config=config)


def test_a_single_node_is_the_default() -> None:
    plan = _resolved(Config()).nodes
    assert plan == NodePlan()
    assert not plan.multi_node


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_nodes": 2}, "rdzv_endpoint must be 'host:port' when num_nodes > 1"),
        ({"num_nodes": 2, "rdzv_endpoint": "node0"}, "rdzv_endpoint must be 'host:port'"),
        ({"num_nodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "node_rank must be below"),
        ({"num_nodes": 0}, "num_nodes must be a whole number >= 1"),
        ({"num_nodes": 2, "rdzv_endpoint": "h:1", "rdzv_backend": "etcd"}, "rdzv_backend must"),
        ({"num_nodes": 2, "rdzv_endpoint": "h:1", "max_restarts": -1}, "max_restarts must"),
        ({"num_nodes": 2, "rdzv_endpoint": "h:1", "rdzv_timeout": 0}, "rdzv_timeout must"),
    ],
)
def test_bad_options_are_refused_before_any_process_starts(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        nb_accel.notebook_launcher(_never_called, num_processes=1, **options)  # type: ignore[arg-type]


def test_accelerates_master_addr_and_use_port_name_the_endpoint() -> None:
    with pytest.raises(ValueError, match="node_rank must be below num_nodes"):
        nb_accel.notebook_launcher(
            _never_called, num_nodes=2, node_rank=5, master_addr="10.0.0.1", use_port=29500
        )
    plan = make_node_plan(2, 1, "10.0.0.1:29500", "c10d", 0, 60)
    assert plan.describe(2) == "node 1 of 2 (ranks 2-3 of 4), rendezvous at 10.0.0.1:29500"


def test_arguments_win_over_the_saved_configuration() -> None:
    saved = Config(num_nodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500", max_restarts=2)
    plan = _resolved(saved, node_rank=0, rdzv_timeout=30).nodes
    assert (plan.num_nodes, plan.node_rank, plan.rdzv_endpoint) == (2, 0, "10.0.0.1:29500")
    assert (plan.max_restarts, plan.rdzv_timeout) == (2, 30.0)


def test_persistent_workers_refuse_a_saved_multi_node_configuration(tmp_path: Path) -> None:
    saved = Config(num_nodes=2, rdzv_endpoint="10.0.0.1:29500")
    with pytest.raises(LaunchError, match="persistent %%distributed workers run on this machine"):
        _resolved(saved, pool=True)
    with pytest.raises(LaunchError, match="num_nodes=2 was given, but persistent"):
        _resolved(Config(), pool=True, num_nodes=2, rdzv_endpoint="10.0.0.1:29500")
    assert _resolved(saved).nodes.num_nodes == 2


def test_node_k_holds_the_kth_block_of_ranks() -> None:
    assert [global_rank(1, local, 2) for local in (0, 1)] == [2, 3]
    assert [global_rank(0, local, 3) for local in (0, 1, 2)] == [0, 1, 2]


def test_hosts_are_checked_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nb_accel.launch.placement.hosts import make_host_plan
    from nb_accel.launch.placement.nodes import NodePlan

    nodes = NodePlan()
    with pytest.raises(ValueError, match="hosts= decides num_nodes"):
        make_host_plan(["a", "b"], None, nodes, given_nodes=True)
    with pytest.raises(ValueError, match=r"for one host, write hosts=\['gpu0'\]"):
        make_host_plan("gpu0", None, nodes, given_nodes=False)
    with pytest.raises(ValueError, match="hosts names a more than once"):
        make_host_plan(["a", "a"], None, nodes, given_nodes=False)
    with pytest.raises(ValueError, match=r"ssh_config .*missing is not a file"):
        make_host_plan(["a"], tmp_path / "missing", nodes, given_nodes=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    with pytest.raises(ValueError, match='hosts="slurm" needs a SLURM allocation'):
        make_host_plan("slurm", None, nodes, given_nodes=False)
    plan = make_host_plan(["a", "b"], None, nodes, given_nodes=False, python="/opt/py")
    assert plan.hosts == ("a", "b") and plan.python == "/opt/py"
    assert plan.describe(4) == "on each of 2 hosts over ssh (a, b), 8 ranks"
    assert make_host_plan("local", None, nodes, given_nodes=True) is None  # this machine


def test_a_pool_takes_the_saved_hosts_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nb_accel import Config, save_config
    from nb_accel.launch.pool import WorkerPool

    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(tmp_path / "config.yaml"))
    save_config(Config(hosts=["gpu0", "gpu1"]))
    pool = WorkerPool(2, cpu=True)  # made, not started: nothing runs yet
    assert pool.hosts is not None and pool.hosts.hosts == ("gpu0", "gpu1")
    assert pool.world_size == 4 and pool.rank_hosts == ["gpu0", "gpu0", "gpu1", "gpu1"]
    assert "on each of 2 hosts over ssh (gpu0, gpu1), 4 ranks" in pool.describe()
    here = WorkerPool(2, cpu=True, hosts="local")
    assert here.hosts is None and here.world_size == 2 and here.rank_hosts is None
