"""Running Accelerate's tests on Accelerate itself (the baseline) and on nb_accel.

A script's test call runs on Accelerate as Accelerate's CI runs its scripts on a CPU: two
processes started by torch's elastic launcher, with ``ACCELERATE_USE_CPU`` set; on nb_accel,
in two processes of ``notebook_launcher``. The unit tests run in a pytest of their own, once
per side, and report through a JUnit XML file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from loopback_torchrun import torchrun_command, torchrun_env

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "call_runner.py"
#: Bound on one launch of a script on Accelerate, in seconds.
LAUNCH_TIMEOUT_S = 150
#: pytest in a process of its own, leaving no cache behind.
_PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider")
#: Bound on one side's run of the unit tests, in seconds.
UNIT_TIMEOUT_S = 900


@dataclass
class Baseline:
    """How one test call went on Accelerate: whether it passed, the calls ``main()`` made,
    and the end of its output (for the reason it failed)."""

    passed: bool
    calls: list[str]
    output: str


def _without_nb_accel_settings() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NB_ACCEL_", "PYTEST_"))}
    env["ACCELERATE_USE_CPU"] = "true"
    return env


def _first_traceback(output: str) -> str:
    """The first worker's traceback in a launch's output (torch's launcher prefixes its lines
    with ``[rankN]:``; its own report of the failure that follows says less), or the output's
    end when there is none."""
    lines = output.splitlines()
    starts = [n for n, line in enumerate(lines) if re.match(r"\[rank\d+\]: Traceback", line)]
    if not starts:
        return output[-4000:]
    prefix = lines[starts[0]].split(" ", 1)[0]
    block = [line for line in lines[starts[0] :] if line.startswith(prefix)]
    cut = next((n for n, line in enumerate(block[1:], 1) if "Traceback (most" in line), len(block))
    return "\n".join(line[len(prefix) + 1 :] for line in block[:cut])[-4000:]


def run_on_accelerate(script: Path, chosen: int, folder: Path) -> Baseline:
    """Run call ``chosen`` (-1: none, only list them) of ``script`` on two CPU processes of
    Accelerate, with results written under ``folder``."""
    result = folder / f"calls-{script.stem}-{chosen}"
    command = torchrun_command([str(RUNNER), str(script), str(chosen), str(result)])
    try:
        done = subprocess.run(
            command,
            cwd=folder,
            env=torchrun_env(_without_nb_accel_settings()),
            capture_output=True,
            text=True,
            timeout=LAUNCH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as timeout:
        return Baseline(False, [], f"no result within {timeout.timeout} s")
    output = _first_traceback(done.stdout + done.stderr)
    files = [Path(f"{result}.{rank}") for rank in (0, 1)]
    if done.returncode != 0 or not all(f.exists() for f in files):
        return Baseline(False, [], output)
    return Baseline(True, json.loads(files[0].read_text()), output)


def run_on_nb_accel(script: Path, chosen: int) -> list[list[str]]:
    """Run call ``chosen`` of ``script`` (an nb_accel twin) on two processes of
    ``notebook_launcher``; each rank's list of the calls ``main()`` made."""
    from call_runner import run_call

    from nb_accel import notebook_launcher

    return notebook_launcher(run_call, args=(str(script), chosen), num_processes=2)


@dataclass
class UnitResult:
    """One unit test's outcome (``passed``, ``failed``, ``skipped``) and message."""

    outcome: str
    message: str


def collect_unit_tests(path: Path) -> list[str]:
    """The ids (``Class::test``) pytest finds in a unit-test file."""
    done = subprocess.run(
        [*_PYTEST, "--collect-only", "-q", path.name],
        cwd=path.parent,
        env=_unit_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    prefix = f"{path.name}::"
    ids = [line[len(prefix) :] for line in done.stdout.splitlines() if line.startswith(prefix)]
    if not ids:
        raise RuntimeError(f"pytest found no tests in {path.name}:\n{done.stdout}{done.stderr}")
    return ids


def _unit_env() -> dict[str, str]:
    env = _without_nb_accel_settings()
    # Accelerate's tracker tests write MLflow's file store (MLflow 3 asks for this switch);
    # nothing may phone home from a test.
    env.update(MLFLOW_ALLOW_FILE_STORE="true", MLFLOW_DISABLE_TELEMETRY="true")
    env["WANDB_MODE"] = "offline"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    return env


def run_unit_tests(path: Path) -> dict[str, UnitResult]:
    """Run a unit-test file with pytest in a process of its own; each test's result by id."""
    report = path.with_suffix(".xml")
    subprocess.run(
        [
            *_PYTEST,
            "-q",
            "-o",
            "junit_family=xunit1",
            f"--junitxml={report}",
            path.name,
        ],
        cwd=path.parent,
        env=_unit_env(),
        capture_output=True,
        text=True,
        timeout=UNIT_TIMEOUT_S,
        check=False,
    )
    results: dict[str, UnitResult] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        test_class = case.get("classname", "").rsplit(".", 1)[-1]
        key = f"{test_class}::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                message = (element.get("message") or "") + "\n" + (element.text or "")
        results[key] = UnitResult(outcome, message.strip())
    return results
