"""The wheel alone is enough: a fresh virtual environment holding only torch and the wheel (with
the dependencies it declares, from the package index) runs a 2-process launch from a script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from built_wheel import scratch_environment
from fresh_venv import CPU_INDEX, environment, pip_environment, run, skip_or_fail_install

#: The torch release the development environment pins (see the Makefile).
TORCH = "2.13.0"
VENV_TIMEOUT_S = 120
PIP_TIMEOUT_S = 480
LAUNCH_TIMEOUT_S = 180

#: A user's script: a shuffled prepared loader and save_state on 2 processes.
SCRIPT = """
import json, sys

import torch
from torch.utils.data import DataLoader

import nb_accel
from nb_accel import Accelerator, notebook_launcher, set_seed


def train(folder):
    set_seed(0)
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(list(range(16)), batch_size=2, shuffle=True))
    seen = [x for batch in loader for x in batch.tolist()]
    return {"seen": seen, "saved": accelerator.save_state(folder)}


if __name__ == "__main__":
    results = notebook_launcher(train, args=(sys.argv[1],), num_processes=2)
    report = {"results": results, "nb_accel": nb_accel.__file__, "torch": torch.__version__}
    print(json.dumps(report))
"""


@pytest.mark.fresh_env
@pytest.mark.timeout(VENV_TIMEOUT_S + PIP_TIMEOUT_S + LAUNCH_TIMEOUT_S + 120)
def test_a_fresh_venv_with_torch_and_the_wheel_runs_a_launch(wheel: Path, tmp_path: Path) -> None:
    venv, work = tmp_path / "venv", tmp_path / "work"
    env = scratch_environment(tmp_path / "tmp")
    status, output = run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], env, VENV_TIMEOUT_S, tmp_path
    )
    assert status == 0, output
    python = venv / "bin" / "python"

    constraints = None
    if sys.platform == "linux":  # PyPI's torch for Linux is a CUDA build of several GB
        constraints = tmp_path / "cpu-torch.txt"
        constraints.write_text(f"torch=={TORCH}+cpu\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile"]
    install += ["--extra-index-url", CPU_INDEX, f"torch=={TORCH}", str(wheel)]
    status, output = run(install, pip_environment(env, constraints), PIP_TIMEOUT_S, tmp_path)
    if status != 0:
        skip_or_fail_install(output, f"torch=={TORCH} and the wheel")

    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    folder = work / "checkpoint"
    command = [str(python), "train.py", str(folder)]
    status, output = run(command, {**environment(venv), **env}, LAUNCH_TIMEOUT_S, work)
    assert status == 0, output
    report = json.loads(output.strip().splitlines()[-1])
    assert Path(report["nb_accel"]).is_relative_to(venv), report  # the wheel, not the sources
    assert report["torch"].split("+")[0] == TORCH, report
    first, second = (result["seen"] for result in report["results"])
    assert sorted(first + second) == list(range(16)) and not set(first) & set(second)
    assert first + second != list(range(16))  # shuffled
    assert {result["saved"] for result in report["results"]} == {str(folder)}
    assert sorted(p.name for p in folder.iterdir()) == [
        "nb_accel_checkpoint.json",
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
