"""The launch side of FSDP with real worker processes (gloo on CPU): what the workers are told,
and the launch's title. (What ``Accelerator()`` then does with it is tested with the runtime.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nb_accel import debug_launcher, notebook_launcher
from nb_accel.config import Config, save_config


def sharding_seen() -> tuple[str | None, str | None, str]:
    """What this worker's environment says about FSDP, and its rank."""
    return (
        os.environ.get("ACCELERATE_USE_FSDP"),
        os.environ.get("FSDP_VERSION"),
        os.environ["RANK"],
    )


def test_fsdp_true_tells_every_worker_to_shard(capsys: pytest.CaptureFixture[str]) -> None:
    results = notebook_launcher(sharding_seen, num_processes=2, cpu=True, fsdp=True)
    assert results == [("true", "2", "0"), ("true", "2", "1")]
    assert "Launching 2 processes on CPU (gloo; fork, FSDP, 2 shards)" in capsys.readouterr().out


def test_fsdp_false_wins_over_the_kernels_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # a leftover of an earlier experiment
    results = notebook_launcher(sharding_seen, num_processes=2, cpu=True, fsdp=False)
    assert [seen[0] for seen in results] == ["false", "false"]
    assert "FSDP" not in capsys.readouterr().out
    left_out = debug_launcher(sharding_seen)  # the saved default: DDP
    assert [seen[0] for seen in left_out] == ["false", "false"]


def test_the_saved_sharding_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = save_config(Config(num_processes=2, sharding="fsdp"), tmp_path / "c.yaml")
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(file))
    assert [seen[0] for seen in notebook_launcher(sharding_seen)] == ["true", "true"]
    assert "FSDP, 2 shards" in capsys.readouterr().out
    assert [seen[0] for seen in debug_launcher(sharding_seen, fsdp=False)] == ["false", "false"]
