"""Values coming back to the kernel hold CPU tensors only, wherever the tensors sat: a
dataclass field, a named tuple, an object's attribute or slot, nested containers.

This machine has no GPU, so the workers make :class:`ElsewhereTensor` values: real tensors that
report ``cuda:0`` as their device (their data is on the CPU) and can only be detached or copied
to the CPU. Unpickled as they are, the kernel would hold tensors that report ``cuda:0``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from nb_accel import notebook_launcher
from nb_accel.launch.pool import WorkerPool, load_value


class ElsewhereTensor(torch.Tensor):
    """A tensor whose device is ``cuda:0``; ``.detach()`` and a copy to the CPU are all it does."""

    payload: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> ElsewhereTensor:
        """Wrap ``data`` (a CPU tensor)."""
        made = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, data.shape, dtype=data.dtype, device=torch.device("cuda", 0)
        )
        made.payload = data
        return made  # type: ignore[no-any-return]

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        """Detach and copy to the CPU; anything else is not supported."""
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default:
            return ElsewhereTensor(args[0].payload)
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu"):
            return args[0].payload.clone()
        raise NotImplementedError(f"{func} on a tensor of another device")


@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    extras: dict[str, Any]


Pair = collections.namedtuple("Pair", "left right")


class Holder:
    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight


class Slotted:
    __slots__ = ("value",)

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


def build(rank: int) -> dict[str, Any]:
    """A value with a tensor of another device in every kind of place."""

    def elsewhere(number: int) -> torch.Tensor:
        return ElsewhereTensor(torch.full((2,), float(number)))

    return {
        "batch": Batch(elsewhere(rank), {"nested": [elsewhere(rank + 1), (elsewhere(rank + 2),)]}),
        "pair": Pair(elsewhere(10), [elsewhere(11)]),
        "holder": Holder(elsewhere(20)),
        "slotted": Slotted(elsewhere(30)),
    }


def _tensors(value: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    batch, pair = value["batch"], value["pair"]
    yield "batch.inputs", batch.inputs
    yield "batch.extras['nested'][0]", batch.extras["nested"][0]
    yield "batch.extras['nested'][1][0]", batch.extras["nested"][1][0]
    yield "pair.left", pair.left
    yield "pair.right[0]", pair.right[0]
    yield "holder.weight", value["holder"].weight
    yield "slotted.value", value["slotted"].value


def _assert_on_cpu(value: dict[str, Any], rank: int) -> None:
    expected = [rank, rank + 1, rank + 2, 10, 11, 20, 30]
    for (where, tensor), number in zip(_tensors(value), expected, strict=True):
        assert type(tensor) is torch.Tensor and tensor.device.type == "cpu", where
        assert tensor.tolist() == [float(number)] * 2, where
    assert isinstance(value["batch"], Batch) and isinstance(value["pair"], Pair)


def build_after_a_collective() -> dict[str, Any]:
    dist.barrier()
    return build(dist.get_rank())


@pytest.mark.timeout(120)
def test_notebook_launcher_returns_every_tensor_on_the_cpu() -> None:
    results = notebook_launcher(build_after_a_collective, num_processes=2)
    for rank, value in enumerate(results):
        _assert_on_cpu(value, rank)


@pytest.mark.timeout(120)
def test_distributed_cell_values_and_pulled_variables_are_on_the_cpu() -> None:
    pool = WorkerPool(2, cpu=True)
    pool.start()
    try:
        pool.push({"build": build})
        done = pool.execute("value = build(rank)\nvalue", want_value=True)
        for rank in (0, 1):
            _assert_on_cpu(load_value(done[rank]), rank)
        for rank, value in enumerate(pool.pull("value")):
            _assert_on_cpu(value, rank)
        # The workers' own values are untouched: still of the other device.
        [kept] = load_value(pool.execute("[value['holder'].weight.device.type]", [1], True)[1])
        assert kept == "cuda"
    finally:
        pool.stop()
