"""The saved configuration: validation, its place, round trip, malformed files, atomic saves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nb_accel.config import Config, ConfigError, config_path, load_config, save_config


def test_values_are_checked_in_one_place_naming_field_and_choices() -> None:
    with pytest.raises(ConfigError, match=r"mixed_precision: must be one of 'no', 'bf16', 'fp16'"):
        Config(mixed_precision="fp8")
    with pytest.raises(ConfigError, match=r"num_processes: must be a whole number >= 1, got 0"):
        Config(num_processes=0)
    with pytest.raises(ConfigError, match=r"rdzv_endpoint: must be 'host:port'"):
        Config(num_nodes=2)
    with pytest.raises(ConfigError, match=r"node_rank: must be below num_nodes \(2\)"):
        Config(num_nodes=2, node_rank=2, rdzv_endpoint="10.0.0.1:29400")
    assert Config(num_nodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400").node_rank == 1
    for bad in (float("nan"), float("inf"), 1e300, 0):
        with pytest.raises(ConfigError, match="timeout: must be a number of seconds above 0"):
            Config(timeout=bad)


def test_hand_written_yaml_quirks_are_understood(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("mixed_precision: no\ntimeout: 1e3\n")  # YAML reads false and "1e3"
    assert load_config(file) == Config(mixed_precision="no", timeout=1000.0)


def test_where_the_file_lives(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NB_ACCEL_CONFIG_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "nb_accel" / "default_config.yaml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_path() == tmp_path / "home" / ".config" / "nb_accel" / "default_config.yaml"
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(tmp_path / "mine.yaml"))
    assert config_path() == tmp_path / "mine.yaml"
    assert config_path(tmp_path / "given.yaml") == tmp_path / "given.yaml"


def test_round_trip_and_missing_file(tmp_path: Path) -> None:
    file = tmp_path / "sub" / "config.yaml"
    assert load_config(file) == Config()  # missing: built-in defaults
    saved = Config(num_processes=3, mixed_precision="bf16", gradient_accumulation_steps=4)
    assert save_config(saved, file) == file
    assert load_config(file) == saved
    assert "mixed_precision: bf16" in file.read_text()


def test_malformed_files_name_the_file_and_the_key(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("num_procesess: 2\n")
    with pytest.raises(ConfigError, match=rf"{file}: unknown key\(s\) num_procesess"):
        load_config(file)
    file.write_text("mixed_precision: fp8\n")
    with pytest.raises(ConfigError, match=rf"{file}: mixed_precision: must be one of"):
        load_config(file)
    file.write_text("num_processes: [2\n")
    with pytest.raises(ConfigError, match=rf"cannot read {file}"):
        load_config(file)


def test_a_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "config.yaml"
    save_config(Config(num_processes=2), file)
    before = file.read_text()

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        save_config(Config(num_processes=7), file)
    assert file.read_text() == before  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temporary left


def _cli(command: str, file: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m nb_accel <command>`` with the configuration file ``file``."""
    env = {**os.environ, "NB_ACCEL_CONFIG_FILE": str(file)}
    return subprocess.run(
        [sys.executable, "-m", "nb_accel", command],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=check,
    )


def test_the_command_line_prints_the_configuration_and_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    save_config(Config(num_processes=2), file)
    shown = _cli("config", file).stdout
    assert f"from {file}" in shown and "num_processes: 2" in shown
    report = _cli("env", file).stdout
    assert "torch:" in report and "CUDA GPUs:" in report and "Notebook front end:" in report
    file.write_text("cpu: maybe\n")
    bad = _cli("config", file, check=False)
    assert bad.returncode == 1 and "cpu: must be true or false" in bad.stderr


def test_hosts_are_a_list_of_names_or_slurm_and_survive_the_file(tmp_path: Path) -> None:
    for bad, said in (
        ("gpu0", 'must be a list of host names, "slurm" or "ray"'),
        ([], 'must be a list of host names, "slurm" or "ray"'),
        (["gpu0", ""], "must hold host names"),
        (["gpu0", "gpu0"], "names gpu0 more than once"),
    ):
        with pytest.raises(ConfigError, match=f"hosts: {said}"):
            Config(hosts=bad)
    with pytest.raises(ConfigError, match="hosts: leave num_nodes at 1"):
        Config(hosts=["a", "b"], num_nodes=2, rdzv_endpoint="a:29500")
    path = tmp_path / "config.yaml"
    saved = Config(hosts=["gpu0", "gpu1"], ssh_config="~/cluster/ssh_config")
    save_config(saved, path)
    assert load_config(path) == saved
    assert Config(hosts="slurm").hosts == "slurm"
