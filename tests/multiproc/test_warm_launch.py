"""``notebook_launcher(..., reuse_workers=True)``: the first launch starts warm workers and
keeps them; later launches of the same shape run on them (the same processes, what they keep
still there) and behave as cold launches do: the function's newest version, the kernel's
environment, working directory and random state at launch time, results and errors as
usual. Another shape replaces them, with a line; a dead rank means fresh workers next time."""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from markers import interrupt_when_marked
from system_features import needs_write_tracking

import nb_accel
from nb_accel import Accelerator, WorkerDiedError, notebook_launcher, resident
from nb_accel.config import ConfigError


@pytest.fixture(autouse=True)
def _no_warm_workers_left() -> Iterator[None]:
    yield
    nb_accel.stop_workers()


def _warm(function: object, *args: object, num_processes: int = 2) -> list[object]:
    return notebook_launcher(function, args=args, num_processes=num_processes, reuse_workers=True)


def where_and_what(step: int) -> tuple[int, int, int, float]:
    """This worker's pid, the step, how many launches its resident list has seen, and a sum
    over the process group."""
    seen = resident("seen", list)
    seen.append(step)
    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    return os.getpid(), step, len(seen), total.item()


def test_a_second_launch_runs_on_the_same_workers_with_what_they_keep() -> None:
    first = _warm(where_and_what, 1)
    second = _warm(where_and_what, 2)
    assert [r[0] for r in first] == [r[0] for r in second]  # the same processes
    assert [r[1:] for r in first] == [(1, 1, 3.0), (1, 1, 3.0)]
    assert [r[1:] for r in second] == [(2, 2, 3.0), (2, 2, 3.0)]  # the resident kept
    workers = {child.pid for child in psutil.Process().children(recursive=True)}
    assert {r[0] for r in first} <= workers
    nb_accel.stop_workers()
    assert psutil.Process().children(recursive=True) == []


def test_each_launch_sees_the_kernel_as_it_is_at_launch_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _warm(where_and_what, 0)  # the workers start here, before any change below

    def look() -> tuple[str | None, str, bool, float, str]:
        return (
            os.environ.get("NB_TEST_WARM"),
            os.getcwd(),
            "/nb-test-warm-path" in __import__("sys").path,
            torch.rand(1).item(),
            Accelerator().mixed_precision,
        )

    monkeypatch.setenv("NB_TEST_WARM", "changed in the kernel")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("/nb-test-warm-path")
    torch.manual_seed(5)
    expected = torch.rand(1).item()
    torch.manual_seed(5)  # a forked worker would start from the kernel's generator
    seen = _warm(look)
    assert seen == [("changed in the kernel", str(tmp_path), True, expected, "no")] * 2
    monkeypatch.delenv("NB_TEST_WARM")
    torch.manual_seed(5)
    assert [s[0] for s in _warm(look)] == [None, None]


def test_a_function_redefined_after_the_workers_started_runs_in_its_new_version() -> None:
    def version() -> str:
        return "first"

    assert _warm(version) == ["first", "first"]

    def version() -> str:  # redefined, as in a notebook
        return "second"

    assert _warm(version) == ["second", "second"]


def fails_on_rank_1() -> int:
    if dist.get_rank() == 1:
        raise ValueError("label 7 is out of range")
    dist.barrier()  # freed by the failed rank's release, not by a timeout
    return 0


def test_a_failing_rank_is_raised_as_usual_and_the_workers_stay_warm() -> None:
    with pytest.raises(ValueError, match="label 7 is out of range") as cold:
        notebook_launcher(fails_on_rank_1, num_processes=2, timeout=600)
    before = [r[0] for r in _warm(where_and_what, 1)]
    with pytest.raises(ValueError, match="label 7 is out of range") as warm:
        notebook_launcher(fails_on_rank_1, num_processes=2, reuse_workers=True, timeout=600)
    # said as a cold launch says it, but for rank 0: the warm worker lives on, with its state
    kept = "Rank 0 was interrupted by this failure and kept its variables."
    assert warm.value.__notes__[0] == cold.value.__notes__[0].replace(
        "Rank 0 was stopped by this failure.", kept
    )
    assert "Raised on rank 1 of 2" in warm.value.__notes__[0] and kept in warm.value.__notes__[0]
    after = _warm(where_and_what, 2)
    assert [r[0] for r in after] == before and [r[2] for r in after] == [2, 2]


def dies_on_rank_1() -> None:
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def test_a_dead_rank_is_replaced_and_the_others_stay_warm() -> None:
    before = _warm(where_and_what, 1)
    with pytest.raises(WorkerDiedError) as died:
        notebook_launcher(dies_on_rank_1, num_processes=2, reuse_workers=True, timeout=600)
    note = died.value.__notes__[-1]
    assert "Rank 1 died and was replaced by a new process" in note
    assert "The variables rank 1 held are gone (the other ranks kept theirs)" in note
    after = _warm(where_and_what, 2)  # on the pool made whole again: no fresh start
    assert after[0][0] == before[0][0] and after[1][0] != before[1][0]
    assert [r[2:] for r in after] == [(2, 3.0), (1, 3.0)]  # rank 1's resident built again
    workers = {child.pid for child in psutil.Process().children(recursive=True)}
    assert workers >= {after[0][0], after[1][0]} and before[1][0] not in workers


def test_a_launch_of_another_shape_replaces_the_workers_and_says_so(
    capfd: pytest.CaptureFixture[str],
) -> None:
    two = {r[0] for r in _warm(where_and_what, 1)}
    three = _warm(where_and_what, 2, num_processes=3)
    assert not two & {r[0] for r in three} and [r[3] for r in three] == [6.0] * 3
    said = capfd.readouterr().err
    assert "The warm workers ran with ranks per node 2: replaced by 3 processes on CPU" in said
    assert len(psutil.Process().children(recursive=False)) == 3


def test_bad_uses_of_reuse_workers_fail_before_anything_starts() -> None:
    with pytest.raises(TypeError, match="reuse_workers must be True or False, got 'yes'"):
        notebook_launcher(print, num_processes=2, reuse_workers="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reuse_workers=True keeps workers this kernel drives"):
        notebook_launcher(
            print,
            num_processes=2,
            reuse_workers=True,
            num_nodes=2,
            node_rank=0,
            rdzv_endpoint="127.0.0.1:29555",
        )
    assert psutil.Process().children(recursive=True) == []


def test_the_saved_setting_keeps_workers_warm_unless_a_launch_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(tmp_path / "config.yaml"))
    nb_accel.save_config(nb_accel.Config(reuse_workers=True))
    first = notebook_launcher(where_and_what, args=(1,), num_processes=2)
    second = notebook_launcher(where_and_what, args=(2,), num_processes=2)
    assert [r[0] for r in first] == [r[0] for r in second] and second[0][2] == 2
    cold = notebook_launcher(where_and_what, args=(3,), num_processes=2, reuse_workers=False)
    assert not {r[0] for r in cold} & {r[0] for r in first} and cold[0][2] == 1
    with pytest.raises(ConfigError, match="reuse_workers: must be true or false"):
        nb_accel.Config(reuse_workers="yes")  # type: ignore[arg-type]


def sleeps_once_marked(folder: str) -> None:
    """Write this rank's marker, then sleep until interrupted."""
    Path(folder, f"rank{dist.get_rank()}").touch()
    time.sleep(600)


def test_an_interrupt_stops_the_function_and_keeps_the_workers(tmp_path: Path) -> None:
    before = [r[0] for r in _warm(where_and_what, 1)]
    with interrupt_when_marked(tmp_path), pytest.raises(KeyboardInterrupt):
        _warm(sleeps_once_marked, str(tmp_path))
    after = _warm(where_and_what, 2)
    assert [r[0] for r in after] == before and [r[2] for r in after] == [2, 2]


@pytest.mark.parametrize("workers_first", [False, True], ids=["inherited", "imported_later"])
def test_a_users_module_changed_on_disk_runs_in_its_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers_first: bool
) -> None:
    nb_accel.stop_workers()
    if workers_first:  # the workers import the module when the function first reaches them
        _warm(where_and_what, 1)
    module = tmp_path / "nb_test_own_module.py"
    module.write_text("def version():\n    return 'first'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import nb_test_own_module

    try:
        assert _warm(nb_test_own_module.version) == ["first", "first"]
        module.write_text("def version():\n    return 'second'\n")
        later = module.stat().st_mtime_ns + 1_000_000_000
        os.utime(module, ns=(later, later))  # a second later, whatever the clock's grain
        importlib.reload(nb_test_own_module)  # as %autoreload does in the kernel
        # the function travels by reference to the module: the workers' copy must be new too
        assert _warm(nb_test_own_module.version) == ["second", "second"]
        module.write_text("def version(:\n")
        os.utime(module, ns=(later + 10**9, later + 10**9))
        with pytest.raises(ImportError, match=r"nb_test_own_module .* changed since this worker"):
            _warm(nb_test_own_module.version)
    finally:
        sys.modules.pop("nb_test_own_module", None)


def train_a_little(seed: int) -> list[float]:
    """A few DDP steps on seeded data: the final weights, rounded."""
    accelerator = Accelerator()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    weights = accelerator.unwrap_model(model).state_dict()
    return [round(float(v.sum()), 5) for v in weights.values()]


@pytest.mark.timeout(240)
def test_thirty_warm_launches_match_a_cold_one_and_hold_no_more() -> None:
    cold = notebook_launcher(train_a_little, args=(3,), num_processes=2)
    kernel = psutil.Process()
    first = _warm(train_a_little, 3)
    workers = kernel.children(recursive=True)
    fds, rss = kernel.num_fds(), sum(w.memory_info().rss for w in workers)
    for _ in range(29):
        assert _warm(train_a_little, 3) == cold
    assert first == cold
    assert kernel.num_fds() <= fds + 2
    grown = sum(w.memory_info().rss for w in workers) - rss
    assert grown <= 40 * 2**20 * len(workers), f"the workers grew by {grown / 2**20:.1f} MB"


def drop_then_look() -> int:
    """Forget the resident list, then how many launches the one built again has seen."""
    assert nb_accel.drop_resident("seen") and not nb_accel.drop_resident("seen")
    return len(resident("seen", list))


def test_a_dropped_resident_is_built_again() -> None:
    _warm(where_and_what, 1)
    assert _warm(drop_then_look) == [0, 0]
    assert [r[2] for r in _warm(where_and_what, 2)] == [1, 1]


def backing_file_and_sum(tensor: torch.Tensor) -> tuple[str, float]:
    """The file this worker's copy of ``tensor`` is mapped from, and its sum."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *fields = line.split(maxsplit=5)
            low, high = (int(part, 16) for part in span.split("-"))
            if low <= address < high:
                return (fields[4].strip() if len(fields) > 4 else ""), float(tensor.sum())
    return "", float(tensor.sum())


def test_a_kernel_tensor_travels_once_while_unchanged_and_is_never_stale() -> None:
    needs_write_tracking()  # else every launch writes it again, which another test holds
    weights = torch.arange(1 << 20, dtype=torch.float64)  # 8 MB
    first = _warm(backing_file_and_sum, weights)
    again = _warm(backing_file_and_sum, weights)
    assert "buffers-" in first[0][0] and again == first  # the segment written once
    seen = {first[0][0]}
    changes = [
        lambda: weights.add_(1.0),
        lambda: weights.numpy().__setitem__(300_000, -1e9),  # a write torch does not count
        lambda: weights[:1].fill_(4.0),  # a byte on the first page
    ]
    for change in changes:
        change()
        after = _warm(backing_file_and_sum, weights)
        assert after[0] == after[1] and after[0][1] == float(weights.sum())  # never stale
        assert after[0][0] not in seen  # written again
        seen.add(after[0][0])


def test_a_shared_tensor_written_by_another_process_is_never_stale() -> None:
    weights = torch.arange(1 << 20, dtype=torch.float64).share_memory_()  # 8 MB, shared
    first = _warm(backing_file_and_sum, weights)
    assert first[0][1] == float(weights.sum())
    pid = os.fork()  # a child writes through its own mapping of the same memory
    if pid == 0:
        try:
            weights.numpy()[:] += 1.0  # NumPy: a forked child must not start torch's threads
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert float(weights.sum()) == first[0][1] + weights.numel()  # the kernel sees the write
    after = _warm(backing_file_and_sum, weights)
    assert [sums for _, sums in after] == [float(weights.sum())] * 2  # and so do the workers
