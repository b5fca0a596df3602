"""A launch's device mesh (``parallelism_config``, or the saved sizes): checked against the
launch's ranks before anything starts, FSDP2 turned on for FSDP shards, Accelerate's variables
for the workers, and the title."""

from __future__ import annotations

from typing import Any

import pytest

from nb_accel import ParallelismConfig
from nb_accel.config import Config, ConfigError
from nb_accel.launch.request import LaunchRequest
from nb_accel.launch.resolve import resolve_spec
from nb_accel.launch.spec import LaunchSpec
from nb_accel.launch.workers import worker_env

pytestmark = pytest.mark.timeout(60)


def spec(config: Config | None = None, **options: Any) -> LaunchSpec:
    request = LaunchRequest(cpu=True, reuse_workers=False, **options)
    return resolve_spec(request, config=config or Config())


def test_the_mesh_is_in_the_title_and_in_the_workers_variables() -> None:
    made = spec(num_processes=4, parallelism_config={"tp_size": 2, "dp_shard_size": 2})
    assert made.title == "Launching 4 processes on CPU (gloo; fork, mesh dp_shard 2 x tp 2)"
    assert made.plan.sharding == "fsdp2"  # FSDP shards: sharded as Accelerator() does
    env = worker_env(made.plan)
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    assert env["PARALLELISM_CONFIG_TP_SIZE"] == env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    assert env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] == env["PARALLELISM_CONFIG_CP_SIZE"] == "1"


def test_a_parallelism_config_object_and_the_saved_sizes_are_taken_too() -> None:
    given = spec(num_processes=2, parallelism_config=ParallelismConfig(tp_size=2))
    assert given.title.endswith("(gloo; fork, mesh tp 2)")
    assert given.plan.sharding == "ddp"
    saved = spec(Config(num_processes=4, dp_replicate_size=2, dp_shard_size=2))
    assert saved.title.endswith("mesh dp_replicate 2 x dp_shard 2)")
    assert "ACCELERATE_USE_PARALLELISM_CONFIG" not in worker_env(spec(num_processes=2).plan)


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"parallelism_config": {"tp_size": 3}}, ValueError, "spans 3 processes"),
        ({"parallelism_config": {"tp": 2}}, ValueError, "has no 'tp'"),
        ({"parallelism_config": {"tp_size": 0}}, ValueError, "tp_size must be a whole number"),
        ({"parallelism_config": "tp=2"}, TypeError, "must be a ParallelismConfig or a dict"),
        ({"parallelism_config": {"cp_size": 2}}, ValueError, "runs on CUDA GPUs only"),
        (
            {"parallelism_config": {"dp_shard_size": 2}, "sharding": "ddp"},
            ValueError,
            "leave sharding",
        ),
        (
            {"parallelism_config": {"tp_size": 2}, "fsdp": True},
            ValueError,
            "no dimension is left for FSDP",
        ),
    ],
)
def test_a_mesh_that_cannot_run_is_refused_before_anything_starts(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        spec(num_processes=2, **options)


def test_the_saved_sizes_must_multiply_to_the_launches_ranks() -> None:
    with pytest.raises(ConfigError, match="tp_size: the mesh's sizes multiply to 2, and the"):
        Config(num_processes=4, tp_size=2)
    assert Config(num_processes=2, num_nodes=2, rdzv_endpoint="a:1", tp_size=2, dp_shard_size=2)
    with pytest.raises(ConfigError, match="dp_shard_size: must be a whole number >= 1"):
        Config(dp_shard_size=0)


def test_the_distributed_magics_take_the_mesh_as_a_flag() -> None:
    import argparse

    from IPython.core.error import UsageError
    from IPython.core.magic_arguments import magic_arguments

    from nb_accel.notebook.magic_flags import flag_text, parse_flags, pool_flags, pool_options

    @magic_arguments()
    @pool_flags
    def magic(line: str) -> None:
        del line

    args = parse_flags(magic, "-n 4 --mesh tp=2,dp_shard_size=2")
    assert pool_options(args) == {
        "num_processes": 4,
        "parallelism_config": {"tp_size": 2, "dp_shard_size": 2},
    }
    parser = magic.parser  # type: ignore[attr-defined]
    assert isinstance(parser, argparse.ArgumentParser)
    written = flag_text(parser, "parallelism_config", args.parallelism_config)
    assert written == "--mesh tp=2,dp_shard=2"
    with pytest.raises(UsageError, match="--mesh takes sizes by dimension"):
        parse_flags(magic, "--mesh tp")
