"""A rank's stacks as faulthandler writes them, read back and said in one line; nb_accel's own
threads are left out; which ranks wait in a collective, and which must abort their own."""

from __future__ import annotations

import faulthandler
import sysconfig
import threading
from pathlib import Path

import pytest

from nb_accel.launch.failures import whereabouts
from nb_accel.launch.failures.whereabouts import Frame, in_own_code, parse_stacks
from nb_accel.worker.reporting import collective_trail
from nb_accel.worker.reporting.collective_trail import LastCollective
from nb_accel.worker.reporting.stacks import MAIN_THREAD

pytestmark = pytest.mark.timeout(30)


def inner(path: Path, ready: threading.Event, done: threading.Event) -> None:
    with path.open("w") as stream:
        faulthandler.dump_traceback(stream, all_threads=True)
    ready.set()
    done.wait(10)


def outer(path: Path, ready: threading.Event, done: threading.Event) -> None:
    inner(path, ready, done)


def test_the_main_thread_is_found_and_summarised_in_the_user_s_frames(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    ready, done = threading.Event(), threading.Event()
    helper = threading.Thread(target=outer, args=(dump, ready, done), name="helper")
    helper.start()
    try:
        assert ready.wait(10)
        header = f"{MAIN_THREAD}0x{helper.ident:x}"  # call the helper the main thread
        stack = parse_stacks(3, header, dump.read_text())
    finally:
        done.set()
        helper.join(10)
    assert stack.main is not None and len(stack.threads) >= 2
    summary = stack.summary()
    assert summary.startswith("at `inner` (test_whereabouts_parsing.py, line ")
    assert "← `outer` (line " in summary
    text = stack.text()
    assert text.startswith("main thread:\n") and "in inner" in text


def test_a_rank_only_in_library_code_is_idle() -> None:
    dump = (
        "Current thread 0x0000000000000abc (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
    )
    header = f"{MAIN_THREAD}0xabc"
    stdlib = sysconfig.get_paths()["stdlib"]
    stack = parse_stacks(0, header, dump.replace("/usr/lib/python3.11", stdlib))
    assert stack.summary() == "idle"
    assert parse_stacks(0, "", dump).summary() == "somewhere without Python frames"


def test_installed_packages_are_named_before_the_standard_library() -> None:
    """A virtual environment's packages lie inside its own ``platstdlib``: still packages."""
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib"):
        torch_file = f"{paths[key]}/torch/distributed/distributed_c10d.py"
        assert Frame(torch_file, 1, "recv").library == "torch"
    assert Frame(f"{paths['stdlib']}/threading.py", 1, "wait").library == "Python"
    assert Frame("/home/me/train.py", 1, "train").library is None


def test_nb_accel_s_own_threads_are_left_out_even_inside_the_standard_library() -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    trail = Path(collective_trail.__file__)
    dump = (
        "Thread 0x0000000000000def (most recent call first):\n"
        f'  File "{stdlib}/json/encoder.py", line 254 in iterencode\n'
        f'  File "{trail}", line 190 in answer_once\n'
        f'  File "{trail}", line 170 in _answer_forever\n'
        f'  File "{stdlib}/threading.py", line 975 in run\n'
        "\n"
        "Thread 0x0000000000000123 (most recent call first):\n"
        f'  File "{stdlib}/threading.py", line 320 in wait\n'
        '  File "/home/me/train.py", line 12 in watch_loss\n'
        "\n"
        "Current thread 0x0000000000000abc (most recent call first):\n"
        '  File "/home/me/train.py", line 30 in main\n'
    )
    text = parse_stacks(0, f"{MAIN_THREAD}0xabc", dump).text()
    assert "train.py, line 30, in main" in text and "in watch_loss" in text  # the user's thread
    assert "encoder.py" not in text and "0xdef" not in text, text


def _dump(main_frames: list[str], other: list[str] | None = None) -> str:
    """A faulthandler dump: another thread first (when given), the main thread last."""
    text = ""
    if other is not None:
        text += "Thread 0x0000000000000123 (most recent call first):\n" + "".join(other) + "\n"
    return (
        text
        + "Current thread 0x0000000000000abc (most recent call first):\n"
        + "".join(main_frames)
    )


WORKER = Path(whereabouts.__file__).parents[2] / "worker" / "process" / "entrypoint.py"
USER = '  File "/home/me/train.py", line 30 in train\n'
WORKER_FRAME = f'  File "{WORKER}", line 10 in main\n'


def test_a_dump_is_whole_once_the_main_thread_reaches_the_worker_s_own_frames() -> None:
    header = f"{MAIN_THREAD}0xabc"
    partial = _dump([USER])  # the rank was paused while writing
    assert not whereabouts._whole(parse_stacks(0, header, partial))
    assert not whereabouts._whole(parse_stacks(0, header, ""))
    assert whereabouts._whole(parse_stacks(0, header, _dump([USER, WORKER_FRAME])))


def test_a_note_gives_the_stacks_that_say_more_than_the_summary() -> None:
    header = f"{MAIN_THREAD}0xabc"
    stdlib = sysconfig.get_paths()["stdlib"]
    waiting = f'  File "{stdlib}/threading.py", line 320 in wait\n'
    plain = parse_stacks(0, header, _dump([USER, WORKER_FRAME]))
    deeper = parse_stacks(1, header, _dump([waiting, USER, WORKER_FRAME]))
    threaded = parse_stacks(2, header, _dump([USER, WORKER_FRAME], [USER]))
    assert plain.told_by_summary and not deeper.told_by_summary
    assert not threaded.told_by_summary
    note = whereabouts.stacks_note({0: plain, 1: deeper, 2: threaded})
    assert "Rank 0" not in note and "Rank 1's stacks:" in note and "Rank 2's stacks:" in note
    assert "threading.py, line 320, in wait" in note and "thread 0x123:" in note
    assert whereabouts.stacks_note({0: plain}) == ""


def test_ranks_in_a_collective_are_told_apart_and_nccl_s_must_abort_their_own() -> None:
    """A gloo rank waits inside torch's call (its stack says so): the failed rank's release
    frees it. An NCCL rank waits outside it (in ``.item()``, say) for a collective its flight
    recorder says has not finished: it must abort its own collectives."""
    header = f"{MAIN_THREAD}0xabc"
    torch_file = f"{sysconfig.get_paths()['purelib']}/torch/distributed/distributed_c10d.py"
    in_torch = f'  File "{torch_file}", line 1 in all_reduce\n'
    working = parse_stacks(0, header, _dump([USER, WORKER_FRAME]))
    gloo = parse_stacks(1, header, _dump([in_torch, USER, WORKER_FRAME]))
    gloo.collective = LastCollective("all_reduce", 3, backend="gloo")
    waiting, finished = (parse_stacks(r, header, _dump([USER, WORKER_FRAME])) for r in (2, 3))
    waiting.collective = LastCollective("all_reduce", 3, state="started", backend="nccl")
    finished.collective = LastCollective("all_reduce", 3, state="completed", backend="nccl")
    # rank 0 works, rank 3's collective finished: both are interrupted; so is rank 4, which
    # could not say where it is
    assert in_own_code([0, 3, 4], {0: working, 3: finished}) == [0, 3, 4]
    assert in_own_code([0, 1], {0: working, 1: gloo}) == [0]  # 1: freed by the release
    assert in_own_code([0, 2, 3], {0: working, 2: waiting, 3: finished}) == [0, 3]  # 2 aborts
