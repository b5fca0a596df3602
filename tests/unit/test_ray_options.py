"""``hosts="ray"`` before anything starts: the options it takes and refuses, the saved
configuration, the magic's flag and the form's text, and what a kernel without Ray is told.
Launches on a real Ray cluster are the Ray lane's (``tests/ray``, ``make test-ray``)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from plans import plan_of

from nb_accel import LaunchError, notebook_launcher
from nb_accel.config import Config, config_problems, load_config, save_config
from nb_accel.notebook.config_widget import hosts_from_text
from nb_accel.notebook.magic_flags import hosts_option

pytestmark = pytest.mark.timeout(60)


def nothing() -> None:
    return None


@pytest.fixture
def without_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel where ``import ray`` fails, whatever is installed."""
    monkeypatch.setitem(sys.modules, "ray", None)


def test_a_kernel_without_ray_is_told_which_extra_to_install(without_ray: None) -> None:
    with pytest.raises(ValueError, match=r"pip install 'nb-accel\[ray\]'"):
        notebook_launcher(nothing, num_processes=2, hosts="ray")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"node_rank": 0}, 'hosts="ray" places the nodes itself'),
        ({"rdzv_endpoint": "10.0.0.1:29500"}, 'hosts="ray" places the nodes itself'),
        ({"ssh_config": "ssh_config"}, 'ssh_config applies to SSH hosts, not to hosts="ray"'),
    ],
)
def test_options_the_cluster_decides_are_refused_before_ray_is_asked(
    without_ray: None, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        notebook_launcher(nothing, num_processes=2, hosts="ray", **options)  # type: ignore[arg-type]


def test_num_nodes_is_how_many_of_the_cluster_s_nodes(without_ray: None) -> None:
    # num_nodes alone is no multi-node launch of this kernel's: no rendezvous is asked for
    with pytest.raises(ValueError, match=r"nb-accel\[ray\]"):
        notebook_launcher(nothing, num_processes=2, hosts="ray", num_nodes=2)
    with pytest.raises(ValueError, match="num_nodes must be a whole number"):
        notebook_launcher(nothing, num_processes=2, hosts="ray", num_nodes=0)


def test_saved_ray_hosts_take_num_nodes_and_survive_the_file(tmp_path: Path) -> None:
    assert config_problems(hosts="ray", num_nodes=3) == {}
    path = tmp_path / "config.yaml"
    save_config(Config(hosts="ray", num_nodes=3), path)
    assert load_config(path).hosts == "ray"
    assert "hosts" in config_problems(hosts="rays")


def test_the_magic_flag_and_the_form_read_ray() -> None:
    assert hosts_option(" ray ") == "ray"
    assert hosts_from_text("ray") == "ray"
    assert hosts_from_text("ray, gpu1") == ["ray", "gpu1"]  # a host that happens to be named so


def test_a_node_process_leaves_out_what_ray_set_for_its_own_workers() -> None:
    from nb_accel.launch.placement.ray_nodes import node_environment

    actor = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace",
        "RAY_JOB_ID": "01000000",
        "RAY_RAYLET_PID": "73",
        "OMP_NUM_THREADS": "2",
    }
    assert node_environment(actor, 2) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "2,3"}
    # what the cluster's own setup chose stays
    mine = {"PYTHONBREAKPOINT": "ipdb.set_trace", "OMP_NUM_THREADS": "4"}
    assert node_environment(mine, 2) == mine
    assert node_environment({"OMP_NUM_THREADS": "1"}, 0) == {}  # a GPU bundle's actor: 0 CPUs


@pytest.fixture
def ray_connected_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel connected to a Ray cluster, as ``ray.is_initialized()`` tells."""
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: True))


def test_a_kernel_connected_to_ray_starts_its_own_workers_without_fork(
    ray_connected_here: None,
) -> None:
    plan = plan_of(num_processes=2, cpu=True, reuse_workers=False)
    assert plan.start_method == "forkserver"
    assert any("connected to a Ray cluster" in note for note in plan.notes), plan.notes
    with pytest.raises(LaunchError, match=r"connected to a Ray cluster.*start_method='spawn'"):
        plan_of(num_processes=2, cpu=True, start_method="fork")


def test_hosts_start_their_own_workers_whatever_the_kernel_s_state(
    ray_connected_here: None, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("")
    plan = plan_of(num_processes=2, cpu=True, hosts=["gpu0", "gpu1"], ssh_config=str(config))
    assert plan.start_method == "fork" and plan.notes == ()
