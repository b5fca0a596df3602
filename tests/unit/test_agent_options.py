"""Accelerate's options for torch's elastic agent (``rdzv_conf``, ``rdzv_id``,
``monitor_interval``, ``log_line_prefix_template``): checked before anything starts, and carried
to the agent's ``LaunchConfig`` on every node and host."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import nb_accel
from nb_accel.config import Config
from nb_accel.launch.multinode.elastic_agent import launch_config
from nb_accel.launch.placement.hosts import make_host_plan
from nb_accel.launch.placement.nodes import (
    DEFAULT_RDZV_ID,
    MONITOR_INTERVAL_S,
    NodePlan,
    make_node_plan,
)
from nb_accel.launch.request import LaunchRequest
from nb_accel.launch.resolve import resolve_spec
from nb_accel.launch.views.output import ROLE_NAME

pytestmark = pytest.mark.timeout(60)

TWO_NODES = {"num_nodes": 2, "node_rank": 0, "rdzv_endpoint": "127.0.0.1:1"}


def _never_called() -> None:
    raise AssertionError("no worker may start")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"rdzv_conf": [("join_timeout", 5)]}, TypeError, "rdzv_conf must be a dict"),
        ({"rdzv_conf": {5: 1}}, TypeError, r"rdzv_conf's keys must be option names \(str\)"),
        ({"rdzv_conf": {"is_host": True}}, ValueError, r"rdzv_conf\['is_host'\] is set by"),
        ({"rdzv_conf": {"run_id": "x"}}, ValueError, "leave it out of rdzv_conf and use rdzv_id"),
        ({"rdzv_conf": {"join_timeout": "soon"}}, ValueError, "must be a number of seconds"),
        ({"rdzv_conf": {"join_timeout": 0}}, ValueError, "must be a number of seconds above 0"),
        (
            {"rdzv_conf": {"join_timeout": 30}, "rdzv_timeout": 60},
            ValueError,
            r"rdzv_timeout=60 and rdzv_conf\['join_timeout'\]=30 disagree",
        ),
        ({"rdzv_id": 42}, TypeError, "rdzv_id must be a str"),
        ({"rdzv_id": " "}, ValueError, "rdzv_id must not be blank"),
        ({"monitor_interval": "0.1"}, TypeError, "monitor_interval must be a number"),
        ({"monitor_interval": True}, TypeError, "monitor_interval must be a number"),
        ({"monitor_interval": 0}, ValueError, "monitor_interval must be a number of seconds above"),
        ({"monitor_interval": math.nan}, ValueError, "above 0"),
        ({"log_line_prefix_template": 3}, TypeError, "log_line_prefix_template must be a str"),
        (
            {"log_line_prefix_template": "[${node}${rank}] "},
            ValueError,
            r"unknown placeholder\(s\) \$\{node\}: the known ones are \$\{rank\}, "
            r"\$\{local_rank\}, \$\{role_name\}",
        ),
        (
            {"log_line_prefix_template": "$host: "},
            ValueError,
            r"unknown placeholder\(s\) \$\{host\}",
        ),
        (
            {"log_line_prefix_template": "[${rank}]", "prefix_output": False},
            ValueError,
            "prefix_output=False turns prefixes off",
        ),
    ],
)
@pytest.mark.parametrize("nodes", [{}, TWO_NODES], ids=["single-node", "multi-node"])
def test_bad_agent_options_are_refused_before_any_process_starts(
    options: dict[str, object], error: type[Exception], message: str, nodes: dict[str, object]
) -> None:
    with pytest.raises(error, match=message):
        nb_accel.notebook_launcher(_never_called, num_processes=1, **nodes, **options)  # type: ignore[arg-type]


def _nodes(config: Config, **options: Any) -> NodePlan:
    """The nodes a launch with ``options`` resolves to, ``config`` saved."""
    return resolve_spec(LaunchRequest(num_processes=1, **options), config=config).nodes


def test_accelerates_defaults_read_as_nb_accels() -> None:
    plan = _nodes(Config(), rdzv_id="none")
    assert plan == NodePlan()
    assert (plan.rdzv_conf, plan.rdzv_id, plan.monitor_interval) == (
        {},
        DEFAULT_RDZV_ID,
        MONITOR_INTERVAL_S,
    )


def test_accelerates_static_backend_is_taken_as_c10d() -> None:
    """Accelerate's default ``rdzv_backend="static"``: fixed nodes, ranks by node_rank."""
    plan = _nodes(
        Config(), num_nodes=2, node_rank=1, rdzv_endpoint="127.0.0.1:29500", rdzv_backend="static"
    )
    assert (plan.rdzv_backend, plan.num_nodes, plan.node_rank) == ("c10d", 2, 1)


def test_join_timeout_is_rdzv_timeout_by_torchs_name() -> None:
    saved = Config(rdzv_timeout=600)
    given = {"join_timeout": 30, "last_call_timeout": 5}
    plan = _nodes(saved, num_nodes=2, node_rank=0, rdzv_endpoint="h:1", rdzv_conf=given)
    assert plan.rdzv_timeout == 30.0  # an argument wins over the saved configuration
    assert plan.rdzv_conf == {"last_call_timeout": 5}  # join_timeout comes from rdzv_timeout
    assert given == {"join_timeout": 30, "last_call_timeout": 5}  # the caller's dict untouched
    agreeing = make_node_plan(2, 0, "h:1", "c10d", 0, 30, rdzv_conf={"join_timeout": 30.0})
    assert agreeing.rdzv_timeout == 30.0 and agreeing.rdzv_conf == {}


def test_the_options_reach_the_agents_launch_config() -> None:
    plan = make_node_plan(
        2,
        1,
        "h:1",
        "c10d",
        0,
        30.5,
        rdzv_conf={"read_timeout": 120, "last_call_timeout": 5},
        rdzv_id="exp-42",
        monitor_interval=0.25,
    )
    config = launch_config(plan, 2, "fork", "/unused")
    assert config.run_id == "exp-42" and config.monitor_interval == 0.25
    assert config.rdzv_configs["join_timeout"] == 31  # from rdzv_timeout, in whole seconds
    assert config.rdzv_configs["read_timeout"] == 120  # the user's, over nb_accel's
    assert config.rdzv_configs["last_call_timeout"] == 5
    assert config.rdzv_configs["is_host"] is False  # node 1 only connects


def test_hosts_carry_the_options_to_every_node() -> None:
    nodes = make_node_plan(
        1, 0, None, "c10d", 0, 60, rdzv_conf={"close_timeout": 9}, rdzv_id="r", monitor_interval=1
    )
    hosts = make_host_plan(["a", "b"], None, nodes, given_nodes=False)
    assert hosts is not None
    second = hosts.node_plan(1, "a:29500", 0)
    assert (second.num_nodes, second.node_rank, second.rdzv_endpoint) == (2, 1, "a:29500")
    assert (second.rdzv_id, second.monitor_interval) == ("r", 1.0)
    assert second.rdzv_conf == {"close_timeout": 9}
    assert second.rdzv_timeout == 60.0


def test_role_name_is_that_of_torchs_elastic_launch() -> None:
    from torch.distributed.launcher.api import LaunchConfig

    fields = {field.name: field for field in dataclasses.fields(LaunchConfig)}
    assert fields["role"].default == ROLE_NAME
