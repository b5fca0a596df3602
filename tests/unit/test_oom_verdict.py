"""What a worker's SIGKILL is said to be: the out-of-memory killer only when the machine's
count of out-of-memory kills rose while it ran, not it when the count stayed, a guess said as
one when nobody knows (another machine's worker, or no count)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nb_accel.launch.failures import oom
from nb_accel.launch.failures.verdict import died_failure

KILLED = -9


def _vmstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kills: int | None) -> Path:
    path = tmp_path / "vmstat"
    lines = ["nr_free_pages 1000", "pgfault 12"]
    lines += [f"oom_kill {kills}"] if kills is not None else []
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(oom, "VMSTAT", path)
    return path


@pytest.mark.timeout(10)
def test_a_kill_while_the_count_rose_is_the_out_of_memory_killer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _vmstat(tmp_path, monkeypatch, 3)
    before = oom.oom_kills()
    assert before == 3
    path.write_text(path.read_text().replace("oom_kill 3", "oom_kill 4"))
    record = died_failure(1, 4242, KILLED, oom_killed=oom.oom_verdict(before))
    assert record.message.startswith("worker for rank 1 (pid 4242) was killed by SIGKILL")
    assert "(the out-of-memory killer: this machine's count" in record.message


@pytest.mark.timeout(10)
def test_a_kill_while_the_count_stayed_is_not_blamed_on_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _vmstat(tmp_path, monkeypatch, 3)
    record = died_failure(1, 4242, KILLED, oom_killed=oom.oom_verdict(oom.oom_kills()))
    assert "not by the out-of-memory killer" in record.message
    assert "kill -9" in record.message


@pytest.mark.timeout(10)
def test_without_a_count_the_cause_is_said_to_be_a_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _vmstat(tmp_path, monkeypatch, None)
    assert oom.oom_kills() is None and oom.oom_verdict(oom.oom_kills()) is None
    record = died_failure(2, 7, KILLED, host="node1")  # another machine's: nobody knows
    assert "(pid 7 on node1) was killed by SIGKILL (perhaps the out-of-memory killer, a guess" in (
        record.message
    )
