"""Big buffers sent again to the same workers: a buffer's segment is kept while its memory is
unwritten (Linux's write tracking tells), and written again after any change, however it was
made; a buffer in memory that another process or mapping can write (every kind of shared
memory) is written every time; without write tracking every command writes its own segments.
The tests that need write tracking skip only where this machine cannot have it, never in CI
(:mod:`system_features`)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from multiprocessing import resource_sharer, resource_tracker, shared_memory
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing
from system_features import needs_write_tracking

from nb_accel.worker.transfer import sent_buffers
from nb_accel.worker.transfer.pickling import loads, pickle_sharing, segments_of
from nb_accel.worker.transfer.sent_buffers import SentBuffers
from nb_accel.worker.transfer.write_watch import WriteWatch, open_write_watch

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tracking() -> None:
    """The test needs write tracking: it skips only where this machine cannot have it (never
    in CI), judged from the system, not from the code under test."""
    needs_write_tracking()


needs_tracking = pytest.mark.usefixtures("tracking")


@pytest.fixture
def watch(tracking: None) -> Iterator[WriteWatch]:
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


@needs_tracking
def test_the_least_recently_sent_segment_goes_first(tmp_path: Path) -> None:
    buffers = SentBuffers(str(tmp_path), budget=20 << 20)
    one, two, three = (np.full(1 << 20, float(i)) for i in range(3))  # 8 MB each
    try:
        files = {}
        for name, value in (("one", one), ("two", two), ("one", one)):  # one sent again last
            data = buffers.seal(pickle_sharing(value))
            buffers.settle(data)
            files[name] = segments_of(data)[0]
        assert len(set(files.values())) == 2  # one's segment was kept and named again
        data = buffers.seal(pickle_sharing(three))
        buffers.settle(data)
        # 24 MB > 20 MB: two goes, sent before one's second sending
        assert sorted(map(str, tmp_path.iterdir())) == sorted([files["one"], *segments_of(data)])
    finally:
        buffers.close()


def _fork_and_run(write: Callable[[], None]) -> None:
    """Run ``write`` in a forked child (its own page tables, the same shared memory)."""
    pid = os.fork()
    if pid == 0:  # the child: write, then leave without running the parent's cleanups
        try:
            write()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


#: One kind of shared memory: made in a folder, it gives the object to send, a write to it
#: through another mapping or process, and a cleanup.
SharedKind = Callable[[Path], tuple[object, Callable[[], None], Callable[[], None]]]


def _share_memory_tensor(folder: Path) -> tuple[object, Callable[[], None], Callable[[], None]]:
    shared = torch.zeros(1 << 20, dtype=torch.float64).share_memory_()  # 8 MB
    return shared, lambda: _fork_and_run(lambda: _add_one(shared)), lambda: None


def _add_one(tensor: torch.Tensor) -> None:
    """Add 1 to every element through NumPy (a forked child must not start torch's threads)."""
    tensor.detach().numpy()[:] += 1.0


def _queue_tensor(folder: Path) -> tuple[object, Callable[[], None], Callable[[], None]]:
    sharer_was_running = resource_sharer._resource_sharer._listener is not None
    original = torch.zeros(1 << 20, dtype=torch.float64)
    queue = torch.multiprocessing.get_context("fork").Queue()
    queue.put(original)  # moved to shared memory; the received tensor maps it again
    received = queue.get(timeout=30)
    queue.close()
    queue.join_thread()

    def close() -> None:
        if not sharer_was_running:  # the thread that passed the memory's descriptor
            resource_sharer.stop(timeout=10)

    return received, lambda: _add_one(original), close


def _shared_memory_block(folder: Path) -> tuple[object, Callable[[], None], Callable[[], None]]:
    tracker_was_running = resource_tracker._resource_tracker._pid is not None
    block = shared_memory.SharedMemory(create=True, size=8 << 20)
    other = shared_memory.SharedMemory(name=block.name)  # a second mapping of the same block
    array = np.ndarray(1 << 20, dtype=np.float64, buffer=block.buf)
    array[:] = 0.0
    writer = np.ndarray(1 << 20, dtype=np.float64, buffer=other.buf)

    def write() -> None:
        writer[:] += 1.0

    def close() -> None:
        nonlocal array, writer
        del array, writer
        other.close()
        block.close()
        block.unlink()
        if not tracker_was_running:  # the process that would unlink what a crash left
            resource_tracker._resource_tracker._stop()

    return array, write, close


def _file_memmap(folder: Path) -> tuple[object, Callable[[], None], Callable[[], None]]:
    path = folder / "mapped.bin"  # as a /dev/shm file's mapping: another mapping writes it
    array = np.memmap(path, dtype=np.float64, mode="w+", shape=(1 << 20,))
    writer = np.memmap(path, dtype=np.float64, mode="r+", shape=(1 << 20,))

    def write() -> None:
        writer[:] += 1.0
        writer.flush()

    def close() -> None:
        nonlocal array, writer
        array._mmap.close()  # type: ignore[attr-defined]
        writer._mmap.close()  # type: ignore[attr-defined]
        del array, writer
        path.unlink()

    return array, write, close


def _hogwild_model(folder: Path) -> tuple[object, Callable[[], None], Callable[[], None]]:
    model = torch.nn.Linear(1024, 1024, bias=False).share_memory()  # 4 MB of weights
    return (
        model.weight.detach(),
        lambda: _fork_and_run(lambda: _add_one(model.weight)),
        lambda: None,
    )


SHARED_KINDS: dict[str, SharedKind] = {
    "share_memory_": _share_memory_tensor,
    "torch.multiprocessing queue": _queue_tensor,
    "multiprocessing.shared_memory": _shared_memory_block,
    "file memmap": _file_memmap,
    "hogwild model": _hogwild_model,
}


@needs_tracking
@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_shared_memory_written_elsewhere_is_never_stale(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / "segments"
    folder.mkdir()
    value, write_elsewhere, close = SHARED_KINDS[kind](tmp_path)
    buffers = SentBuffers(str(folder))
    try:
        first = buffers.seal(pickle_sharing((value,)))
        buffers.settle(first)
        assert list(folder.iterdir()) == []  # memory others can write is never kept
        write_elsewhere()  # through another mapping or another process's page tables
        again = buffers.seal(pickle_sharing((value,)))
        (loaded,) = loads(again)
        expected = value.numpy() if isinstance(value, torch.Tensor) else value
        assert np.array_equal(np.asarray(loaded), np.asarray(expected)), kind  # the new bytes
        assert float(np.asarray(loaded).sum()) > 0
        buffers.settle(again)
        del loaded
    finally:
        buffers.close()
        close()
    assert list(folder.iterdir()) == []
