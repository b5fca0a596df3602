"""Big buffers sent again to the same workers: a buffer's segment is kept while its memory is
unwritten (Linux's write tracking tells), and written again after any change, however it was
made; without write tracking every command writes its own segments."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from nb_accel.worker.transfer import sent_buffers
from nb_accel.worker.transfer.pickling import loads, pickle_sharing, segments_of
from nb_accel.worker.transfer.sent_buffers import SentBuffers
from nb_accel.worker.transfer.write_watch import WriteWatch, open_write_watch

pytestmark = pytest.mark.timeout(60)


def _tracking_available() -> bool:
    watch = open_write_watch()
    if watch is None:
        return False
    watch.close()
    return True


# Machines of the project's CI have write tracking: there these tests must run.
needs_tracking = pytest.mark.skipif(
    not os.environ.get("CI") and not _tracking_available(),
    reason="this kernel has no write tracking (userfaultfd + PAGEMAP_SCAN, Linux 6.7+)",
)


@pytest.fixture
def watch() -> Iterator[WriteWatch]:
    opened = open_write_watch()
    assert opened is not None, "write tracking is not available on this machine"
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def sent(tmp_path: Path) -> Iterator[SentBuffers]:
    buffers = SentBuffers(str(tmp_path))
    try:
        yield buffers
    finally:
        buffers.close()


def _span(array: np.ndarray) -> tuple[int, int]:
    return int(array.ctypes.data), array.nbytes


@needs_tracking
def test_every_kind_of_write_is_seen(watch: WriteWatch) -> None:
    array = np.zeros(3 << 20, dtype=np.uint8)
    assert watch.watch(*_span(array)) and not watch.written(*_span(array))
    array[2 << 20] = 1  # a write from user code
    assert watch.written(*_span(array))

    untouched = np.empty(8 << 20, dtype=np.uint8)  # pages never touched yet
    assert watch.watch(*_span(untouched)) and not watch.written(*_span(untouched))
    read, write = os.pipe()
    try:
        os.write(write, b"x" * 64)
        os.readv(read, [memoryview(untouched)[5 << 20 : (5 << 20) + 64]])  # the OS writes
    finally:
        os.close(read)
        os.close(write)
    assert watch.written(*_span(untouched))

    again = np.ones(2 << 20, dtype=np.uint8)
    assert watch.watch(*_span(again))
    watch.forget(*_span(again))
    assert watch.written(*_span(again))  # not watched any more: counts as written


@needs_tracking
def test_freed_memory_counts_as_written(watch: WriteWatch) -> None:
    freed = np.ones(16 << 20, dtype=np.uint8)  # big enough to have a mapping of its own
    span = _span(freed)
    assert watch.watch(*span)
    del freed
    gc.collect()
    assert watch.written(*span)


@needs_tracking
def test_an_unchanged_buffer_is_written_once_and_every_change_is_sent(
    sent: SentBuffers, tmp_path: Path
) -> None:
    weights = torch.arange(1 << 20, dtype=torch.float64)  # 8 MB
    first = sent.seal(pickle_sharing((weights,)))
    sent.settle(first)
    again = sent.seal(pickle_sharing((weights,)))
    assert segments_of(again) == segments_of(first)  # not written again
    assert len(list(tmp_path.iterdir())) == 1
    sent.settle(again)

    changes = [
        lambda: weights.add_(1.0),  # torch, in place
        # Inside the buffer's whole pages: a NumPy view, which torch does not see, and
        # another tensor on the same memory.
        lambda: weights.numpy().__setitem__(300_000, -5.0),
        lambda: torch.from_numpy(weights.numpy())[600_000:600_001].fill_(9.0),
    ]
    previous = segments_of(again)
    for change in changes:
        change()
        data = sent.seal(pickle_sharing((weights,)))
        assert segments_of(data) != previous
        (loaded,) = loads(data)
        assert torch.equal(loaded, weights)  # never stale
        previous = segments_of(data)
        sent.settle(data)
        assert list(tmp_path.iterdir()) == [Path(p) for p in previous]  # the old one removed


@needs_tracking
def test_kept_segments_go_when_their_buffer_changes_or_the_budget_is_passed(
    tmp_path: Path,
) -> None:
    buffers = SentBuffers(str(tmp_path), budget=20 << 20)
    one, two, three = (np.full(1 << 20, float(i)) for i in range(3))  # 8 MB each
    try:
        files = {}
        for name, value in (("one", one), ("two", two)):
            data = buffers.seal(pickle_sharing(value))
            buffers.settle(data)
            files[name] = segments_of(data)[0]
        assert sorted(map(str, tmp_path.iterdir())) == sorted(files.values())  # both kept
        data = buffers.seal(pickle_sharing(three))
        buffers.settle(data)
        files["three"] = segments_of(data)[0]
        # 24 MB > 20 MB: the least recently sent goes
        assert sorted(map(str, tmp_path.iterdir())) == sorted([files["two"], files["three"]])
        two[1 << 19] = -1.0  # changed in the kernel: its segment is of no use any more
        data = buffers.seal(pickle_sharing(three))
        assert segments_of(data) == [files["three"]]
        buffers.settle(data)
        assert [str(p) for p in tmp_path.iterdir()] == [files["three"]]
    finally:
        buffers.close()
    assert list(tmp_path.iterdir()) == []


def test_without_write_tracking_every_command_writes_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sent_buffers, "open_write_watch", lambda: None)
    buffers = SentBuffers(str(tmp_path))
    values = np.arange(1 << 18, dtype=np.float64)
    try:
        first = buffers.seal(pickle_sharing(values))
        assert np.array_equal(loads(first), values)
        buffers.settle(first)
        assert list(tmp_path.iterdir()) == []  # nothing kept
        second = buffers.seal(pickle_sharing(values))
        assert segments_of(second) != segments_of(first)
        buffers.settle(second)
    finally:
        buffers.close()
    assert list(tmp_path.iterdir()) == []


@needs_tracking
def test_bytes_sharing_a_page_with_other_objects_are_compared(
    sent: SentBuffers, tmp_path: Path
) -> None:
    whole = np.zeros((3 << 20) + 3 * 4096, dtype=np.uint8)
    part = whole[1000:-1000]  # starts and ends inside pages other bytes share
    first = sent.seal(pickle_sharing(part))
    sent.settle(first)
    whole[0] = whole[-1] = 7  # the neighbours change, the part does not: still kept
    again = sent.seal(pickle_sharing(part))
    assert segments_of(again) == segments_of(first)
    sent.settle(again)
    for index in (0, -1):  # a byte of the part on a shared page
        part[index] += 1
        data = sent.seal(pickle_sharing(part))
        assert segments_of(data) != segments_of(again) and np.array_equal(loads(data), part)
        sent.settle(data)
        again = data
