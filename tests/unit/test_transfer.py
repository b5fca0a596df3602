"""Pickling with big buffers aside: sealed into a segment file (mapped copy-on-write when
loaded) or, without a folder or room in it, carried inside the bytes; small objects stay a
plain pickle."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from nb_accel.worker.transfer import segments
from nb_accel.worker.transfer.pickling import loads, pickle_sharing, segments_of

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 19  # float32 elements: 2 MiB, above the 1 MiB threshold


def _tied() -> torch.nn.Module:
    first, second = torch.nn.Linear(1024, 512), torch.nn.Linear(1024, 512)
    second.weight = first.weight
    return torch.nn.Sequential(first, second)


def _value() -> dict:
    weights = torch.arange(BIG, dtype=torch.float32)
    return {
        "weights": weights,
        "view": weights[7:11],
        "model": _tied(),
        "halves": torch.ones(BIG, dtype=torch.bfloat16),
        "array": np.arange(BIG, dtype=np.float64),
        "strided": np.arange(BIG, dtype=np.float64)[::2],
        "readonly": np.frombuffer(bytes(BIG * 4), dtype=np.float32),
        "empty": torch.empty(0),
        "small": torch.ones(3),
    }


def _check(loaded: dict, original: dict) -> None:
    assert torch.equal(loaded["weights"], original["weights"])
    assert torch.equal(loaded["view"], original["weights"][7:11])
    assert loaded["view"].untyped_storage().data_ptr() == loaded["weights"].data_ptr()
    assert loaded["model"][0].weight is loaded["model"][1].weight
    assert loaded["halves"].dtype == torch.bfloat16 and torch.equal(
        loaded["halves"], original["halves"]
    )
    for name in ("array", "strided", "readonly"):
        assert np.array_equal(loaded[name], original[name])
    assert loaded["empty"].numel() == 0 and torch.equal(loaded["small"], torch.ones(3))


def test_big_buffers_go_into_one_segment_that_loading_maps(tmp_path: Path) -> None:
    value = _value()
    pickled = pickle_sharing(value)
    assert len(pickled.buffers) >= 4  # weights, tied weight, halves, array, readonly
    data = pickled.seal(str(tmp_path))
    assert len(data) < value["strided"].nbytes + 2**20  # only the strided array is inside
    (segment,) = segments_of(data)
    assert Path(segment).parent == tmp_path
    first = loads(data)
    _check(first, value)
    first["weights"].add_(1.0)  # copy-on-write: neither the original nor the file changes
    first["array"] += 1.0
    assert torch.equal(value["weights"], torch.arange(BIG, dtype=torch.float32))
    second = loads(data, consume=True)
    _check(second, value)
    assert list(tmp_path.iterdir()) == []  # consumed: the file is gone, the mappings stay
    assert float(second["weights"].sum()) == float(value["weights"].sum())


def test_without_a_folder_the_buffers_travel_inside_the_bytes() -> None:
    value = _value()
    data = pickle_sharing(value).seal(None)
    assert segments_of(data) == [] and len(data) > BIG * 4
    _check(loads(data), value)


def test_a_folder_without_room_keeps_the_buffers_in_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "_SPARE_BYTES", 1 << 62)  # no file system has that much
    value = _value()
    data = pickle_sharing(value).seal(str(tmp_path))
    assert segments_of(data) == [] and list(tmp_path.iterdir()) == []
    _check(loads(data), value)


def test_small_objects_stay_a_plain_pickle(tmp_path: Path) -> None:
    data = pickle_sharing({"x": torch.ones(3), "a": np.ones(4)}).seal(str(tmp_path))
    loaded = pickle.loads(data)
    assert torch.equal(loaded["x"], torch.ones(3)) and list(tmp_path.iterdir()) == []


def test_loading_in_the_pickling_process_uses_the_original_memory() -> None:
    value = _value()
    loaded = pickle_sharing(value).load()
    assert loaded["weights"].data_ptr() == value["weights"].data_ptr()
    _check(loaded, value)


def test_a_worker_whose_kernel_is_elsewhere_sends_its_big_buffers_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nb_accel.worker.process.returns import dumps_result

    big = torch.arange(BIG, dtype=torch.float32)
    monkeypatch.setenv(segments.SHARE_DIR_ENV, str(tmp_path))
    shared = dumps_result(big)
    assert len(segments_of(shared)) == 1  # the kernel on this machine maps it
    assert loads(shared, consume=True).equal(big)
    monkeypatch.setenv(segments.INLINE_ENV, "1")  # as the workers on other hosts have it
    inline = dumps_result(big)
    assert segments_of(inline) == []
    assert list(tmp_path.iterdir()) == []  # nothing written for a kernel that cannot map it
    assert loads(inline).equal(big)
