"""Installing the wheel where Colab's and Kaggle's notebook packages already are (at their
versions, ``../shared/stacks/``) changes none of them: pip adds nb_accel and nothing else moves,
with the services' package list as its constraints."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from built_wheel import scratch_environment
from fresh_venv import pip_environment, run, skip_or_fail_install

ROOT = Path(__file__).resolve().parents[2]
#: The torch release the development environment pins (see the Makefile).
TORCH = "2.13.0"
#: What nb_accel depends on that the services' runtimes already have (torch apart).
RUNTIME_PACKAGES = (
    "ipython",
    "ipywidgets",
    "ipykernel",
    "jupyter_client",
    "traitlets",
    "numpy",
    "tqdm",
    "cloudpickle",
    "safetensors",
    "huggingface_hub",
    "pyyaml",
    "packaging",
)
TIMEOUT_S = 420


def _lanes() -> ModuleType:
    """``tools/lane_env.py``: the stacks' constraints, as the lanes install under them."""
    spec = importlib.util.spec_from_file_location("lane_env", ROOT / "tools" / "lane_env.py")
    assert spec is not None and spec.loader is not None
    if spec.name in sys.modules:
        return sys.modules[spec.name]
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _freeze(python: Path, env: dict[str, str], cwd: Path) -> dict[str, str]:
    command = [sys.executable, "-m", "pip", "--python", str(python), "list", "--format=freeze"]
    status, output = run(command, env, 120, cwd)
    assert status == 0, output
    pairs = (line.split("==", 1) for line in output.splitlines() if "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


@pytest.mark.fresh_env
@pytest.mark.timeout(3 * TIMEOUT_S)
@pytest.mark.parametrize("lane", ["colab", "kaggle"])
def test_installing_under_a_services_stack_changes_none_of_its_packages(
    wheel: Path, tmp_path: Path, lane: str
) -> None:
    lanes = _lanes()
    if not (lanes.STACKS / lanes.LANES[lane].stack).exists():
        pytest.fail(f"the stacks are missing: {lanes.STACKS}")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(lanes.constraints(lanes.LANES[lane]))
    venv, env = tmp_path / "venv", scratch_environment(tmp_path / "tmp")
    status, output = run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], env, 120, tmp_path
    )
    assert status == 0, output
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile"]
    stack_env = pip_environment(env, constraints)
    # the runtime as the service has it: torch, its notebook packages, at the service's versions
    status, output = run(
        [*pip, f"torch=={TORCH}", *RUNTIME_PACKAGES], stack_env, TIMEOUT_S, tmp_path
    )
    if status != 0:
        skip_or_fail_install(output, f"torch=={TORCH} and {lane}'s notebook packages")
    before = _freeze(python, env, tmp_path)
    status, output = run([*pip, str(wheel)], stack_env, TIMEOUT_S, tmp_path)
    assert status == 0, f"the wheel does not install under {lane}'s versions:\n{output[-4000:]}"
    after = _freeze(python, env, tmp_path)
    changed = {name: (version, after.get(name)) for name, version in before.items()}
    assert {name: pair for name, pair in changed.items() if pair[0] != pair[1]} == {}
    assert set(after) - set(before) == {"nb-accel"}
    expected = {"ipython": "7.34.0", "traitlets": "5.7.1", "ipykernel": "6.17.1"}
    expected["ipywidgets"] = "8.1.5" if lane == "kaggle" else "7.7.1"
    assert {name: after[name] for name in expected} == expected  # the service's own
