"""Launch view benchmark: what one progress report costs the kernel, from 2 to 64 ranks.

Run from the repository root::

    .venv/bin/python benchmarks/widget.py            # or: make bench
    .venv/bin/python benchmarks/widget.py --reports 8000 --rounds 7

For each rank count the notebook's launch view (``ProgressWidget``) is fed the stream of
reports a launch sends it: the ranks report in turn, each report moves the rank's outer bar
(3 epochs) and inner bar (1000 batches, each rank at its own speed); the view's clock advances
1/(8 x ranks) s per report (every rank reporting 8 times a second, the most a worker sends),
and the view is ticked every simulated second, as the launcher does. Every widget gets a comm
that serialises each message to JSON, as the kernel would before sending it, and counts it.

Figures, median over rounds (the rank counts alternate within each round): the kernel's time
per report (the ``report`` and ``tick`` calls, wall time, divided by the number of reports)
and the widget messages to the browser per report (state updates; opening the widgets is
counted apart), each with its ratio to the 2-rank figure of the same run. Then the same per
second of the launch (every rank reporting 8 times a second): the kernel's milliseconds of work
per second, as a share of one core, and the messages per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import comm
import ipywidgets
from comm.base_comm import BaseComm
from machine import run_header

from nb_accel._messages import BarState, Report
from nb_accel.notebook.progress_widget import ProgressWidget

RANK_COUNTS = (2, 8, 16, 64)
REPORTS_PER_RANK_PER_S = 8.0


class CountingComm(BaseComm):  # type: ignore[misc]
    """A comm that serialises what it would send, and counts it."""

    opened = 0
    updates = 0

    def publish_msg(self, msg_type: str, data: Any = None, *args: Any, **kwargs: Any) -> None:
        """Serialise ``data`` and count the message."""
        json.dumps(data, default=str)
        if msg_type == "comm_open":
            CountingComm.opened += 1
        elif msg_type == "comm_msg":
            CountingComm.updates += 1


class SimulatedClock:
    """The view's clock: moved by the benchmark, one report at a time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _bars(rank: int, step: int) -> tuple[BarState, ...]:
    """Rank ``rank``'s bars at its ``step``-th report (slower ranks advance less)."""
    done = step * (10 + rank % 7)
    epoch, batch = divmod(done, 1000)
    elapsed = step / REPORTS_PER_RANK_PER_S
    loss = f"loss={1 / (1 + done):.4f}"
    return (
        BarState(0, 0, "epoch", min(epoch, 3), 3, "it", elapsed, 12.5, "", False, True),
        BarState(1, 1, "batch", batch, 1000, "it", elapsed, 12.5, loss, False, True),
    )


def measure(world_size: int, reports: int) -> tuple[float, float, int]:
    """Seconds per report, messages per report, and widgets opened, for one launch view."""
    clock = SimulatedClock()
    CountingComm.opened = CountingComm.updates = 0
    view = ProgressWidget(f"{world_size} ranks", world_size, clock=clock)
    for rank in range(world_size):
        view.started(rank, 1000 + rank)
    opened, CountingComm.updates = CountingComm.opened, 0
    step_s = 1.0 / (REPORTS_PER_RANK_PER_S * world_size)
    next_tick = 1.0
    events = [Report(i % world_size, _bars(i % world_size, i // world_size), (), 0.0)
              for i in range(reports)]  # fmt: skip
    spent = 0.0
    for event in events:
        clock.now += step_s
        start = time.perf_counter()
        view.report(event)
        if clock.now >= next_tick:
            view.tick()
            next_tick += 1.0
        spent += time.perf_counter() - start
    messages = CountingComm.updates
    view.widget.close_all()
    return spent / reports, messages / reports, opened


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=4000, help="reports per launch view")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    comm.create_comm = CountingComm
    print(run_header(ipywidgets=ipywidgets.__version__))
    costs: dict[int, list[float]] = {n: [] for n in RANK_COUNTS}
    messages: dict[int, list[float]] = {n: [] for n in RANK_COUNTS}
    widgets: dict[int, int] = {}
    measure(2, args.reports)  # warm-up
    for index in range(args.rounds):
        for world_size in RANK_COUNTS if index % 2 == 0 else RANK_COUNTS[::-1]:
            cost, sent, opened = measure(world_size, args.reports)
            costs[world_size].append(cost)
            messages[world_size].append(sent)
            widgets[world_size] = opened
    print(
        f"Launch view cost per report, {args.reports} reports per view, 8 reports/s per rank; "
        f"median of {args.rounds} rounds"
    )
    heads = ("ranks", "us/report", "vs 2", "msgs/report", "vs 2", "widgets")
    print(
        " ".join(
            f"{head:>{width}}" for head, width in zip(heads, (5, 10, 6, 12, 6, 8), strict=True)
        )
    )
    base_cost = statistics.median(costs[2])
    base_sent = statistics.median(messages[2])
    for world_size in RANK_COUNTS:
        cost, sent = statistics.median(costs[world_size]), statistics.median(messages[world_size])
        print(
            f"{world_size:>5} {cost * 1e6:>10.1f} {cost / base_cost:>5.2f}x {sent:>12.2f} "
            f"{sent / base_sent:>5.2f}x {widgets[world_size]:>8}"
        )
    print("\nThe same per second of a launch (each rank reporting 8 times a second)")
    heads = ("ranks", "ms/s", "% core", "vs 2", "msgs/s", "vs 2")
    print(" ".join(f"{h:>{w}}" for h, w in zip(heads, (5, 8, 7, 6, 8, 6), strict=True)))
    rate = {n: REPORTS_PER_RANK_PER_S * n for n in RANK_COUNTS}  # reports per second
    base_ms = base_cost * rate[2] * 1e3
    base_msgs = base_sent * rate[2]
    for world_size in RANK_COUNTS:
        ms = statistics.median(costs[world_size]) * rate[world_size] * 1e3
        msgs = statistics.median(messages[world_size]) * rate[world_size]
        print(
            f"{world_size:>5} {ms:>8.2f} {ms / 10:>6.2f}% {ms / base_ms:>5.2f}x "
            f"{msgs:>8.1f} {msgs / base_msgs:>5.2f}x"
        )


if __name__ == "__main__":
    main()
