"""A %%distributed cell's value travels only from the rank whose value is used."""

from __future__ import annotations

from jupyter_client.blocking import BlockingKernelClient
from kernel_driver import CellRun, run_cell, running_kernel

#: A last expression that says on which rank it is pickled for the kernel.
LOUD_VALUE = """%%distributed --all-ranks
class Loud:
    def __reduce__(self):
        print(f"value pickled on rank {rank}")
        return (int, (rank,))

Loud()
"""


def _ok(client: BlockingKernelClient, code: str) -> CellRun:
    run = run_cell(client, code)
    assert run.status == "ok", (run.ename, run.evalue, run.stderr)
    return run


def test_only_the_shown_rank_sends_its_value_unless_all_are_stored() -> None:
    with running_kernel() as (_, client):
        _ok(client, "%load_ext nb_accel")
        _ok(client, "%%distributed -n 2\npass")
        shown = _ok(client, LOUD_VALUE)
        assert "[rank 0] value pickled on rank 0" in shown.stdout
        assert "rank 1" not in shown.stdout  # rank 1's value is never used: never pickled
        assert shown.results and shown.results[0]["text/plain"] == "0"
        stored = _ok(client, LOUD_VALUE.replace("--all-ranks", "--all-ranks -o loud"))
        assert "[rank 1] value pickled on rank 1" in stored.stdout
        assert _ok(client, "print(loud)").stdout.strip() == "[0, 1]"
        first = _ok(client, LOUD_VALUE.replace("--all-ranks", "--all-ranks --ranks 1"))
        assert "value pickled on rank 1" in first.stdout
        assert first.results[0]["text/plain"] == "1"
        _ok(client, "%distributed stop")
