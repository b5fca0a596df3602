"""Collectives on real worker groups (gloo, CPU), and their single-process behaviour."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from nb_accel import PartialState, notebook_launcher
from nb_accel.runtime.collectives.ops import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    gather_object_among,
    pad_across_processes,
    reduce,
)


def _error_of(call: Any) -> str:
    try:
        call()
    except DistributedOperationException as exc:
        return str(exc)
    return "no error"


def collectives_on_two_ranks() -> dict[str, Any]:
    rank = dist.get_rank()
    base = torch.arange(3.0) + 10 * rank
    out: dict[str, Any] = {}
    out["gather"] = gather(base).tolist()
    nested = gather({"a": base.long(), "b": (torch.tensor(float(rank)), [base[:1]])})
    out["gather_nested"] = (
        nested["a"].tolist(),
        nested["b"][0].tolist(),
        nested["b"][1][0].tolist(),
    )
    out["gather_object_lists"] = gather_object([f"r{rank}a", f"r{rank}b"])
    out["gather_object_dicts"] = gather_object({"rank": rank})
    value = torch.tensor([1.0 + rank, 5.0 - rank])
    out["sum"] = reduce(value, "sum").tolist()
    out["mean"] = reduce(value).tolist()
    out["max"] = reduce(value, reduction="max").tolist()
    out["min"] = reduce({"v": value}, reduction="min")["v"].tolist()
    out["int_mean"] = reduce(torch.tensor([rank + 2]), "mean").tolist()
    out["scaled"] = reduce(value, "sum", scale=0.5).tolist()
    out["input_kept"] = value.tolist() == [1.0 + rank, 5.0 - rank]
    with pytest.raises(ValueError, match="reduction"):
        reduce(value, "median")
    sent = broadcast({"t": torch.full((2,), float(rank))}, from_process=1)
    out["broadcast"] = sent["t"].tolist()
    out["broadcast_objects"] = broadcast_object_list([rank, {"from": rank}], from_process=1)
    ragged = torch.ones(rank + 1, 2) * (rank + 1)
    padded = pad_across_processes(ragged, pad_index=-1)
    out["pad"] = padded.tolist()
    out["pad_first"] = pad_across_processes(ragged, pad_first=True).tolist()
    out["pad_dim1"] = pad_across_processes(torch.ones(2, rank + 2), dim=1).shape[1]
    out["pad_then_gather"] = gather(padded).shape[0]
    return out


def test_collectives_on_two_ranks() -> None:
    results = notebook_launcher(collectives_on_two_ranks, num_processes=2)
    for rank, out in enumerate(results):
        assert out["gather"] == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
        assert out["gather_nested"] == ([0, 1, 2, 10, 11, 12], [0.0, 1.0], [0.0, 10.0])
        assert out["gather_object_lists"] == ["r0a", "r0b", "r1a", "r1b"]
        assert out["gather_object_dicts"] == [{"rank": 0}, {"rank": 1}]
        assert out["sum"] == [3.0, 9.0]
        assert out["mean"] == [1.5, 4.5]
        assert out["max"] == [2.0, 5.0]
        assert out["min"] == [1.0, 4.0]
        assert out["int_mean"] == [2.5]
        assert out["scaled"] == [1.5, 4.5]
        assert out["input_kept"]
        assert out["broadcast"] == [1.0, 1.0]
        assert out["broadcast_objects"] == [1, {"from": 1}]
        mine = [[rank + 1.0] * 2] * (rank + 1)
        assert out["pad"] == mine + [[-1.0, -1.0]] * (1 - rank)
        assert out["pad_first"] == [[0.0, 0.0]] * (1 - rank) + mine
        assert out["pad_dim1"] == 3
        assert out["pad_then_gather"] == 4


#: The torch.distributed collectives the functions of ops.py call.
COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "broadcast",
    "all_gather_object",
    "broadcast_object_list",
)


def _counting(calls: Counter[str], name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    return counted


def collectives_without_and_with_debug_mode() -> dict[str, Any]:
    """The collectives gather, broadcast and reduce run, outside and in debug mode, and the
    errors debug mode gives for mismatched shapes."""
    rank = dist.get_rank()
    calls: Counter[str] = Counter()
    real = {name: getattr(dist, name) for name in COLLECTIVES}
    for name in COLLECTIVES:
        setattr(dist, name, _counting(calls, name, real[name]))
    tree = {"a": torch.ones(2) * rank, "b": [torch.zeros(3, 2)]}
    out: dict[str, Any] = {}
    try:
        for mode in ("0", "1"):
            os.environ["ACCELERATE_DEBUG_MODE"] = mode
            for operation in (gather, broadcast, reduce):
                calls.clear()
                operation(tree)
                out[f"{operation.__name__}_{mode}"] = dict(calls)
        os.environ["ACCELERATE_DEBUG_MODE"] = "0"
        out["gathered"] = gather(torch.ones(2) * rank).tolist()
        os.environ["ACCELERATE_DEBUG_MODE"] = "1"
        ragged = torch.zeros(rank + 1)
        out["errors"] = [_error_of(lambda op=op: op(ragged)) for op in (gather, broadcast, reduce)]
    finally:
        for name in COLLECTIVES:
            setattr(dist, name, real[name])
        del os.environ["ACCELERATE_DEBUG_MODE"]
    return out


def test_gather_checks_shapes_only_in_debug_mode() -> None:
    for out in notebook_launcher(collectives_without_and_with_debug_mode, num_processes=2):
        # One all_gather per tensor; debug mode adds one for the shapes, as it does for the
        # broadcast and the all_reduce of broadcast and reduce.
        assert out["gather_0"] == {"all_gather": 2}
        assert out["gather_1"] == {"all_gather": 3}
        assert out["broadcast_0"] == {"broadcast": 2}
        assert out["broadcast_1"] == {"broadcast": 2, "all_gather": 1}
        assert out["reduce_0"] == {"all_reduce": 2}
        assert out["reduce_1"] == {"all_reduce": 2, "all_gather": 1}
        assert out["gathered"] == [0.0, 0.0, 1.0, 1.0]
        gather_error, broadcast_error, reduce_error = out["errors"]
        assert "gather needs tensors of the same size" in gather_error
        assert "{0: 1, 1: 2}" in gather_error and "pad_across_processes" in gather_error
        assert "broadcast needs tensors of the same size" in broadcast_error
        assert "reduce needs tensors of the same size" in reduce_error


def gather_among_two_of_three() -> list[Any] | None:
    rank = dist.get_rank()
    if rank == 1:
        return None  # takes no part: must not be needed by the others
    return gather_object_among({"rank": rank, "t": torch.full((rank + 1,), rank)}, (0, 2))


def test_gather_among_some_ranks_leaves_the_others_out() -> None:
    results = notebook_launcher(gather_among_two_of_three, num_processes=3)
    assert results[1] is None
    for result in (results[0], results[2]):
        assert [item["rank"] for item in result] == [0, 2]
        assert [item["t"].tolist() for item in result] == [[0], [2, 2, 2]]


def test_single_process_is_identity() -> None:
    tensor = torch.arange(4.0)
    tree = {"a": tensor, "b": [tensor[:2]]}
    assert gather(tree) is tree
    assert gather_object(["x"]) == ["x"]
    assert broadcast(tree) is tree
    assert broadcast_object_list([1, 2]) == [1, 2]
    assert pad_across_processes(tree) is tree
    reduced = reduce(tensor, "mean")
    assert torch.equal(reduced, tensor) and reduced is not tensor
    assert reduce(tensor, "sum", scale=2.0).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert gather_object_among("me", [0]) == ["me"]


def debug_mode_set_on_the_state() -> list[bool | str]:
    """``PartialState().debug = True`` turns debug mode on for the process (Accelerate's
    spelling in its own tests), ``False`` turns it off again."""
    state = PartialState()
    ragged = torch.zeros(dist.get_rank() + 1)
    state.debug = True
    seen: list[bool | str] = [PartialState().debug, _error_of(lambda: gather(ragged))]
    state.debug = False
    seen.append(PartialState().debug)
    return seen


def test_debug_mode_can_be_set_on_the_state() -> None:
    for on, error, off in notebook_launcher(debug_mode_set_on_the_state, num_processes=2):
        assert on is True and off is False
        assert "gather needs tensors of the same size" in str(error)
