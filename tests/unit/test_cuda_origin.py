"""Who initialised CUDA: the first call that could have, named with its line (simulated on the
CPU: the calls are made, and the kernel is told its CUDA cannot be forked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

#: Asks what a launch would say once CUDA is found initialised.
ASK = """
from nb_accel.launch import plan
from nb_accel.runtime.device_types import cuda_facts, device_type
cuda_facts.cuda_works_after_fork = lambda: False  # what a kernel whose CUDA is initialised finds
cuda = device_type("cuda")
try:
    plan._start_method(cuda, "fork", explicit=True)
except Exception as error:
    print("ERROR", error)
print("NOTE", plan._start_method(cuda, "fork", explicit=False)[1][0])
"""


def _run(tmp_path: Path, code: str) -> str:
    script = tmp_path / "my_notebook.py"
    script.write_text(code + ASK)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, check=True
    )
    return done.stdout


def test_the_line_that_initialised_cuda_is_named(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "import nb_accel\nimport torch\n\ndef load_model():\n"
        "    return torch.cuda.is_available()  # line 5\n\nload_model()\n",
    )
    said = "by `torch.cuda.is_available()` at my_notebook.py, line 5"
    assert f"ERROR CUDA is already initialised in this kernel ({said})" in out, out
    assert f"NOTE CUDA was initialised in this kernel ({said}); starting workers with" in out


def test_a_call_before_nb_accel_was_imported_says_how_to_find_out(tmp_path: Path) -> None:
    out = _run(tmp_path, "import torch\ntorch.cuda.device_count()\nimport nb_accel\n")
    assert "before nb_accel was imported" in out and "`import nb_accel` the notebook's" in out
