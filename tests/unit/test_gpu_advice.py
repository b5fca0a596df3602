"""Advice read from NVML before a GPU launch: bf16 on GPUs that emulate it, and NCCL transports
that hang on consumer multi-GPU machines; shown at launch, in the plan and in the config form."""

from __future__ import annotations

from pathlib import Path

import pytest
from plans import plan_of

from nb_accel.launch.workers import worker_env
from nb_accel.notebook.config_widget import ConfigWidget
from nb_accel.runtime.device_types import cuda_facts, nvml
from nb_accel.runtime.device_types.gpu_advice import bf16_note, nccl_transport_env
from nb_accel.runtime.device_types.nvml import GpuInfo, GpuReport

T4 = GpuInfo("Tesla T4", "GPU-aaaa", (7, 5))
A100 = GpuInfo("NVIDIA A100-SXM4-40GB", "GPU-bbbb", (8, 0))
RTX4090 = GpuInfo("NVIDIA GeForce RTX 4090", "GPU-cccc", (8, 9))
OLD_DRIVER = "535.129.03"


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> list[GpuReport]:
    """Two GPUs; the test puts the NVML report it wants in the list."""
    reports: list[GpuReport] = []
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(nvml, "gpu_report", lambda: reports[0])
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    monkeypatch.delenv("NCCL_IB_DISABLE", raising=False)
    return reports


def test_bf16_is_flagged_below_compute_capability_8() -> None:
    note = bf16_note([T4])
    assert note is not None and "\n" not in note
    assert note.startswith("bf16 on Tesla T4 (compute capability 7.5) is emulated and slow")
    assert "mixed_precision='fp16'" in note
    assert bf16_note([A100]) is None and bf16_note([RTX4090]) is None
    assert bf16_note([GpuInfo("unknown")]) is None  # no capability known: nothing said
    assert bf16_note([A100, T4]) is not None


def test_a_bf16_launch_on_a_t4_says_so_and_fp16_does_not(gpus: list[GpuReport]) -> None:
    gpus.append(GpuReport((T4, T4), "550.54.15"))
    [note] = plan_of(num_processes=2, mixed_precision="bf16", cpu=False).notes
    assert "Tesla T4" in note and "emulated" in note
    assert plan_of(num_processes=2, mixed_precision="fp16", cpu=False).notes == ()
    gpus[0] = GpuReport((A100, A100), "550.54.15")
    assert plan_of(num_processes=2, mixed_precision="bf16", cpu=False).notes == ()


@pytest.mark.parametrize(
    ("names", "driver", "ranks", "environ", "expected"),
    [
        ([RTX4090, RTX4090], OLD_DRIVER, 2, {}, {"NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"}),
        ([RTX4090, RTX4090], "550.40.06", 2, {}, {"NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"}),
        ([RTX4090, RTX4090], "550.40.07", 2, {}, set()),  # the fixed driver
        ([RTX4090, RTX4090], "560.35.03", 2, {}, set()),
        ([RTX4090, RTX4090], OLD_DRIVER, 1, {}, set()),  # one rank: no transport between GPUs
        ([A100, A100], OLD_DRIVER, 2, {}, set()),  # data-centre GPUs are fine
        ([RTX4090, RTX4090], None, 2, {}, set()),  # driver unknown: leave NCCL alone
        ([RTX4090, RTX4090], "weird", 2, {}, set()),
        ([RTX4090, RTX4090], OLD_DRIVER, 2, {"NCCL_P2P_DISABLE": "0"}, {"NCCL_IB_DISABLE"}),
        (
            [RTX4090, RTX4090],
            OLD_DRIVER,
            2,
            {"NCCL_P2P_DISABLE": "0", "NCCL_IB_DISABLE": "0"},
            set(),
        ),
    ],
)
def test_nccl_transports_rule(
    names: list[GpuInfo],
    driver: str | None,
    ranks: int,
    environ: dict[str, str],
    expected: set[str],
) -> None:
    env, note = nccl_transport_env(names, driver, ranks, environ)
    assert set(env) == expected and all(value == "1" for value in env.values())
    assert (note is not None) == bool(expected)
    if note is not None:
        assert note.startswith(f"NVIDIA GeForce RTX 4090 with driver {driver}:")
        assert all(f"{name}=1" in note for name in expected) and "550.40.07" in note


def test_the_workers_of_an_rtx_4090_launch_get_the_variables(gpus: list[GpuReport]) -> None:
    gpus.append(GpuReport((RTX4090, RTX4090), OLD_DRIVER))
    plan = plan_of(num_processes=2, cpu=False)
    env = worker_env(plan)
    assert env["NCCL_P2P_DISABLE"] == env["NCCL_IB_DISABLE"] == "1"
    [note] = plan.notes
    assert "NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1" in note
    assert "NCCL_P2P_DISABLE" not in worker_env(plan_of(num_processes=2, cpu=True))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, ["a", "b", "c"]),
        ("2,0", ["c", "a"]),
        ("1,7,0", ["b"]),  # CUDA stops at the first entry that names no device
        ("", []),
        ("GPU-bb,GPU-c", ["b", "c"]),
        ("GPU-", []),  # ambiguous
    ],
)
def test_visible_devices_are_read_as_cuda_reads_them(spec: str | None, expected: list[str]) -> None:
    gpus = [GpuInfo(name, f"GPU-{name * 4}") for name in "abc"]
    chosen = nvml.visible(gpus, spec)
    assert chosen is not None and [gpu.name for gpu in chosen] == expected
    assert nvml.visible(gpus, "MIG-1234") is None


def test_the_config_form_notes_bf16_on_a_t4(tmp_path: Path, gpus: list[GpuReport]) -> None:
    gpus.append(GpuReport((T4, T4), "550.54.15"))
    form = ConfigWidget(tmp_path / "config.yaml")
    note = form.field_messages["mixed_precision"]
    assert note.value == ""
    form.controls["mixed_precision"].value = "bf16"
    assert "Tesla T4 (compute capability 7.5) is emulated and slow" in note.value
    assert "fp16" in note.value and not form.save_button.disabled  # a note, not a problem
    form.controls["cpu"].value = True  # bf16 on the CPU: nothing to say about the GPU
    assert note.value == ""
    form.controls["cpu"].value = False
    form.controls["mixed_precision"].value = "fp16"
    assert note.value == ""
    gpus[0] = GpuReport((A100,), "550.54.15")
    form = ConfigWidget(tmp_path / "config.yaml")
    form.controls["mixed_precision"].value = "bf16"
    assert form.field_messages["mixed_precision"].value == ""
