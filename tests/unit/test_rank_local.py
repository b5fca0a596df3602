"""Per-rank values where ranks are threads of one process (TPU v2/v3): each rank thread sees
its own, other threads the process's; each rank's print output goes to its own stream."""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nb_accel.runtime.rank_local import (
    RankLocal,
    RankLocalDict,
    RoutedStream,
    become_rank_thread,
    install_stream,
    is_rank_thread,
)


def in_threads(*targets: Callable[[], Any]) -> list[Any]:
    """Run each target in a thread of its own, all at once; their results in order."""
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []
    together = threading.Barrier(len(targets))

    def run(index: int, target: Callable[[], Any]) -> None:
        try:
            together.wait(timeout=30)
            results[index] = target()
        except BaseException as error:  # noqa: BLE001 - re-raised by the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def test_rank_threads_hold_values_of_their_own_and_leave_the_process_value() -> None:
    value: RankLocal[list[int]] = RankLocal(list)
    value.get().append(-1)  # the process's
    together = threading.Barrier(2)

    def rank(number: int) -> tuple[bool, list[int]]:
        become_rank_thread()
        value.get().append(number)
        together.wait(timeout=30)  # both have written before either reads
        return is_rank_thread(), list(value.get())

    assert in_threads(lambda: rank(0), lambda: rank(1)) == [(True, [0]), (True, [1])]
    assert value.get() == [-1]
    assert not is_rank_thread()
    # a thread that is no rank's sees the process's value
    assert in_threads(lambda: list(value.get())) == [[-1]]


def test_a_rank_thread_sets_its_own_value() -> None:
    channel: RankLocal[str | None] = RankLocal(lambda: None)
    channel.set("process")

    def rank(name: str) -> str | None:
        become_rank_thread()
        before = channel.get()
        channel.set(name)
        return f"{before} -> {channel.get()}"

    assert in_threads(lambda: rank("a"), lambda: rank("b")) == ["None -> a", "None -> b"]
    assert channel.get() == "process"


class Shared:
    """A class whose instances share one ``__dict__`` per rank, like the state classes."""

    shared: Any = RankLocalDict()

    def __init__(self, index: int | None = None) -> None:
        self.__dict__ = self.shared
        if index is not None:
            self.index = index


def test_instances_share_state_within_a_rank_and_not_across_rank_threads() -> None:
    def rank(index: int) -> tuple[int, int]:
        become_rank_thread()
        Shared(index)
        return Shared().index, len(Shared.shared)

    assert in_threads(lambda: rank(0), lambda: rank(1)) == [(0, 1), (1, 1)]
    assert "index" not in Shared.shared


@pytest.fixture
def restored_stdout() -> Iterator[None]:
    before = sys.stdout
    yield
    sys.stdout = before


@pytest.mark.usefixtures("restored_stdout")
def test_each_rank_thread_prints_to_its_own_stream() -> None:
    streams = [io.StringIO(), io.StringIO()]
    installed = threading.Barrier(2)

    def rank(index: int) -> None:
        become_rank_thread()
        install_stream("stdout", streams[index])
        installed.wait(timeout=30)  # both installed before either prints
        print(f"from rank {index}")
        sys.stdout.flush()

    in_threads(lambda: rank(0), lambda: rank(1))
    routed = sys.stdout
    assert isinstance(routed, RoutedStream)
    # a thread that is no rank's prints to the stream of the rank that came first
    in_threads(lambda: print("from another thread", file=routed))
    assert "from rank 0\n" in streams[0].getvalue()
    assert "from rank 1\n" in streams[1].getvalue()
    assert "from rank 1" not in streams[0].getvalue()
    assert "from rank 0" not in streams[1].getvalue()
    assert sum("from another thread" in s.getvalue() for s in streams) == 1


@pytest.mark.usefixtures("restored_stdout")
def test_outside_rank_threads_the_stream_is_installed_as_it_is() -> None:
    stream = io.StringIO()
    install_stream("stdout", stream)
    assert sys.stdout is stream
