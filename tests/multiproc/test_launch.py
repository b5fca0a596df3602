"""notebook_launcher with real worker processes (gloo on CPU): results, state, environment."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from nb_accel import (
    Accelerator,
    DistributedType,
    PartialState,
    debug_launcher,
    notebook_launcher,
)

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def report_state() -> dict[str, object]:
    state = PartialState()
    return {
        "env": {name: os.environ[name] for name in RANK_VARIABLES},
        "process_index": state.process_index,
        "num_processes": state.num_processes,
        "device": str(state.device),
        "distributed_type": state.distributed_type,
        "is_main_process": state.is_main_process,
        "pg_initialized": dist.is_initialized(),
        "pg_world": dist.get_world_size(),
    }


def test_each_rank_gets_its_environment_and_state() -> None:
    results = notebook_launcher(report_state, num_processes=3)
    for rank, result in enumerate(results):
        assert result["env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "3",
        }
        assert result["process_index"] == rank
        assert result["num_processes"] == 3
        assert result["device"] == "cpu"
        assert result["distributed_type"] == DistributedType.MULTI_CPU
        assert result["is_main_process"] is (rank == 0)
        assert result["pg_initialized"] and result["pg_world"] == 3


def all_reduce_rank(offset: float) -> torch.Tensor:
    value = torch.tensor([float(dist.get_rank()) + offset])
    dist.all_reduce(value)
    return value


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_results_in_rank_order_for_every_start_method(method: str) -> None:
    def closure(scale: int) -> tuple[int, float]:
        return dist.get_rank() * scale, all_reduce_rank(0.5).item()

    results = notebook_launcher(closure, args=(10,), num_processes=2, start_method=method)
    assert results == [(0, 2.0), (10, 2.0)]


def test_lambda_kwargs_and_tensor_results() -> None:
    results = notebook_launcher(
        lambda a, b=0: torch.full((2,), float(dist.get_rank() + a + b)),
        args=(1,),
        kwargs={"b": 10},
        num_processes=2,
    )
    assert [r.tolist() for r in results] == [[11.0, 11.0], [12.0, 12.0]]
    assert all(r.device.type == "cpu" for r in results)


def test_twenty_launches_in_a_row_with_changing_sizes() -> None:
    for index in range(20):
        size = 1 + index % 3
        results = notebook_launcher(all_reduce_rank, args=(0.0,), num_processes=size)
        expected = float(sum(range(size)))
        assert [r.item() for r in results] == [expected] * size


def test_single_process_returns_one_element_and_does_not_spoil_later_launches() -> None:
    assert notebook_launcher(report_state, num_processes=1)[0]["num_processes"] == 1
    assert [r["process_index"] for r in notebook_launcher(report_state, num_processes=2)] == [0, 1]


def mixed_precision_seen() -> str:
    return Accelerator().mixed_precision


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_mixed_precision_reaches_the_workers(precision: str) -> None:
    results = notebook_launcher(mixed_precision_seen, num_processes=2, mixed_precision=precision)
    assert results == [precision, precision]


def test_fp16_on_the_cpu_is_launched() -> None:
    results = notebook_launcher(
        mixed_precision_seen, num_processes=2, mixed_precision="fp16", cpu=True
    )
    assert results == ["fp16", "fp16"]


def test_launch_line_and_worker_output_reach_the_caller(capsys: pytest.CaptureFixture[str]) -> None:
    def talk() -> None:
        print(f"hello from {dist.get_rank()}")
        print("partial", end="")

    notebook_launcher(talk, num_processes=2)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "Launching 2 processes on CPU (gloo; fork)"
    # With more than one rank every line is prefixed, from the first on.
    assert lines[1] in ("[rank 0] hello from 0", "[rank 1] hello from 1")
    assert "[rank 0] hello from 0" in lines and "[rank 1] hello from 1" in lines
    assert out.count("partial") == 2
    assert all(line.count("hello from") <= 1 for line in lines)  # ranks never share a line
    assert all(line.count("partial") <= 1 for line in lines)


def only_rank_0_prints() -> None:
    if dist.get_rank() == 0:
        print("loss 0.5")
        print("loss 0.4")


def test_output_is_prefixed_from_the_first_line(capsys: pytest.CaptureFixture[str]) -> None:
    notebook_launcher(only_rank_0_prints, num_processes=2)
    assert capsys.readouterr().out.splitlines()[1:] == ["[rank 0] loss 0.5", "[rank 0] loss 0.4"]
    notebook_launcher(only_rank_0_prints, num_processes=1)
    assert capsys.readouterr().out.splitlines()[1:] == ["loss 0.5", "loss 0.4"]


def test_prefixes_can_be_turned_off(capsys: pytest.CaptureFixture[str]) -> None:
    notebook_launcher(lambda: print("plain"), num_processes=2, prefix_output=False)
    assert capsys.readouterr().out.count("\nplain\n") + 0 >= 1


@pytest.mark.timeout(120)
def test_accelerates_log_line_prefix_template_prefixes_each_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def talk() -> None:
        print(f"hello from {dist.get_rank()}\nbye")

    notebook_launcher(talk, num_processes=2, log_line_prefix_template="[${role_name}${rank}]:")
    lines = capsys.readouterr().out.splitlines()[1:]
    assert sorted(lines) == [
        "[default_role0]:bye",
        "[default_role0]:hello from 0",
        "[default_role1]:bye",
        "[default_role1]:hello from 1",
    ]
    notebook_launcher(only_rank_0_prints, num_processes=1, log_line_prefix_template="${rank}> ")
    assert capsys.readouterr().out.splitlines()[1:] == ["0> loss 0.5", "0> loss 0.4"]


@pytest.mark.timeout(120)
def test_rendezvous_options_warn_that_a_single_node_launch_has_no_rendezvous() -> None:
    with pytest.warns(UserWarning, match="rdzv_conf has no effect on a single-node launch"):
        results = notebook_launcher(lambda: 7, num_processes=2, rdzv_conf={"join_timeout": 30})
    assert results == [7, 7]
    with pytest.warns(UserWarning, match="rdzv_id, monitor_interval have no effect"):
        notebook_launcher(lambda: 7, num_processes=1, rdzv_id="exp", monitor_interval=0.1)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("error")
def test_accelerates_default_rendezvous_options_do_not_warn() -> None:
    results = notebook_launcher(
        lambda: 7, num_processes=2, rdzv_conf={}, rdzv_id="none", monitor_interval=None
    )
    assert results == [7, 7]


def listening_addresses() -> list[str]:
    dist.barrier()
    me = psutil.Process()
    sockets = getattr(me, "net_connections", None) or me.connections  # psutil 5 (Colab's)
    addresses = [c.laddr.ip for c in sockets(kind="inet") if c.status == psutil.CONN_LISTEN]
    dist.barrier()
    return addresses


def test_nothing_listens_beyond_loopback() -> None:
    for addresses in notebook_launcher(listening_addresses, num_processes=2):
        assert all(a.startswith("127.") or a == "::1" for a in addresses), addresses


def test_kernel_state_does_not_leak_into_workers(tmp_path: os.PathLike[str]) -> None:
    kernel_state = PartialState()
    assert kernel_state.num_processes == 1
    store = dist.FileStore(os.path.join(str(tmp_path), "kernel-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        results = notebook_launcher(report_state, num_processes=2)
        assert [r["num_processes"] for r in results] == [2, 2]
        assert [r["pg_world"] for r in results] == [2, 2]
        # The kernel's own group still works after the launch.
        value = torch.ones(1)
        dist.all_reduce(value)
        assert value.item() == 1.0
    finally:
        dist.destroy_process_group()
        PartialState._reset_state()


def test_debug_launcher_runs_on_cpu() -> None:
    assert debug_launcher(lambda: str(PartialState().device)) == ["cpu", "cpu"]


def settings_seen() -> tuple[int, str, int]:
    from nb_accel import Accelerator

    accelerator = Accelerator()
    steps = accelerator.gradient_accumulation_steps
    return accelerator.num_processes, accelerator.mixed_precision, steps


def test_saved_defaults_apply_and_arguments_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nb_accel.config import Config, ConfigError, save_config

    saved = Config(num_processes=2, mixed_precision="bf16", gradient_accumulation_steps=4)
    file = save_config(saved, tmp_path / "c.yaml")
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(file))
    assert notebook_launcher(settings_seen) == [(2, "bf16", 4)] * 2
    explicit = notebook_launcher(settings_seen, num_processes=1, mixed_precision="no")
    assert explicit == [(1, "no", 4)]
    file.write_text("num_processes: two\n")
    with pytest.raises(ConfigError, match=str(file)):
        notebook_launcher(settings_seen)
