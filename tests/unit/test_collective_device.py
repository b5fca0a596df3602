"""Which tensors a collective moves (decided from the backend's name, no GPU needed), and the
debug-mode switch."""

from __future__ import annotations

import pytest
import torch

from nb_accel.runtime.device_backends.placement import move_target, served_device_types
from nb_accel.runtime.device_backends.shape_checks import DEBUG_VARIABLE, debug_mode

CPU, GPU0, GPU1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)


def test_backends_serve_their_device_types() -> None:
    assert served_device_types("nccl") == {"cuda"}
    assert served_device_types("gloo") == {"cpu"}
    assert served_device_types("cpu:gloo,cuda:nccl") == {"cpu", "cuda"}
    assert served_device_types("something-new") == set()


@pytest.mark.parametrize(
    "tensor_device, backend, device, expected",
    [
        (CPU, "nccl", GPU0, GPU0),  # a CPU tensor under NCCL goes to the rank's GPU
        (GPU1, "nccl", GPU0, GPU0),  # so does a tensor on another GPU
        (GPU0, "nccl", GPU0, None),  # the rank's own GPU: no copy
        (CPU, "gloo", CPU, None),
        (GPU0, "gloo", CPU, CPU),  # gloo runs on the CPU
        (CPU, "cpu:gloo,cuda:nccl", GPU0, None),  # the group serves CPU tensors itself
        (CPU, "something-new", GPU0, None),  # an unknown backend: left as it is
        (CPU, None, GPU0, None),  # a single process: no collective
    ],
)
def test_move_target(
    tensor_device: torch.device, backend: str | None, device: torch.device, expected: object
) -> None:
    assert move_target(tensor_device, backend, device) == expected


def test_debug_mode_follows_accelerate_s_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    assert debug_mode() is False
    for value, expected in (("1", True), ("True", True), ("yes", True), ("0", False)):
        monkeypatch.setenv(DEBUG_VARIABLE, value)
        assert debug_mode() is expected
    monkeypatch.setenv(DEBUG_VARIABLE, "maybe")
    with pytest.raises(ValueError, match=f"{DEBUG_VARIABLE}='maybe'"):
        debug_mode()


def test_partial_state_debug_follows_accelerate_debug_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from nb_accel import PartialState

    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    assert PartialState(cpu=True).debug is True
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "0")
    assert PartialState(cpu=True).debug is False
