"""Tensor-tree helpers and the dispatcher's byte packing, in one process."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch

from nb_accel.runtime.data.wire import layout, pack_into, unpack
from nb_accel.runtime.tree import (
    concatenate,
    find_batch_size,
    get_data_structure,
    has_only_tensors,
    initialize_tensors,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

Pair = namedtuple("Pair", ["a", "b"])


def test_recursively_apply_keeps_container_types() -> None:
    data = {"x": [torch.ones(2), (torch.zeros(1), "tag")], "p": Pair(torch.ones(1), 3)}
    out = recursively_apply(lambda t: t + 1, data)
    assert isinstance(out["p"], Pair) and out["p"].b == 3
    assert isinstance(out["x"][1], tuple) and out["x"][1][1] == "tag"
    assert out["x"][0].tolist() == [2.0, 2.0]
    with pytest.raises(TypeError, match="tensors"):
        recursively_apply(lambda t: t, data, error_on_other_type=True)


def test_send_to_device_skips_keys() -> None:
    class Moved:
        def to(self, device: object, non_blocking: bool = False) -> str:
            return f"moved to {device}"

    out = send_to_device({"a": Moved(), "b": Moved(), "c": [Moved()]}, "cpu", skip_keys="b")
    assert out["a"] == "moved to cpu" and isinstance(out["b"], Moved)
    assert out["c"] == ["moved to cpu"]


def test_batch_size_slice_and_concatenate() -> None:
    batch = OrderedDict(x=torch.arange(12).reshape(6, 2), y=[torch.arange(6)])
    assert find_batch_size(batch) == 6
    with pytest.raises(ValueError, match="empty"):
        find_batch_size([])
    part = slice_tensors(batch, slice(2, 4))
    assert part["y"][0].tolist() == [2, 3]
    whole = concatenate([slice_tensors(batch, slice(0, 3)), slice_tensors(batch, slice(3, 6))])
    assert isinstance(whole, OrderedDict)
    assert torch.equal(whole["x"], batch["x"]) and torch.equal(whole["y"][0], batch["y"][0])


def test_data_structure_round_trip() -> None:
    data = (torch.zeros(2, 3, dtype=torch.float16), {"m": torch.zeros(4, dtype=torch.bool)})
    fresh = initialize_tensors(get_data_structure(data))
    assert fresh[0].shape == (2, 3) and fresh[0].dtype == torch.float16
    assert fresh[1]["m"].dtype == torch.bool


def test_has_only_tensors() -> None:
    assert has_only_tensors((torch.ones(1), {"a": torch.ones(1)}))
    assert not has_only_tensors([torch.ones(1), "text"])
    assert not has_only_tensors(3)


def test_pack_and_unpack_any_dense_dtype_and_shape() -> None:
    tree = {
        "f": torch.randn(3, 5)[:, ::2],  # not contiguous
        "b": torch.tensor([True, False, True]),
        "h": torch.randn(2, 2).to(torch.bfloat16),
        "s": torch.tensor(7, dtype=torch.int64),  # 0-d
        "e": torch.empty(0, 4),
        "meta": ["name", 3, None],
        "c": torch.randn(2, dtype=torch.complex64),
    }
    spec, tensors, size = layout(tree)
    assert size % 16 == 0
    buffer = torch.empty(32 + size, dtype=torch.uint8)
    pack_into(buffer, spec, tensors, 32)
    back = unpack(spec, buffer, 32)
    assert back["meta"] == ["name", 3, None]
    for key in ("f", "b", "h", "s", "e", "c"):
        assert back[key].dtype == tree[key].dtype and torch.equal(back[key], tree[key]), key
    again, _, _ = layout(tree)
    assert again == spec  # same shapes: same layout, so no new layout needs sending
    changed, _, _ = layout({**tree, "f": torch.randn(4, 3)})
    assert changed != spec
