"""tqdm's own bars drawn in a worker (``tqdm.auto``, ``tqdm.tqdm``, ``tqdm.notebook``) become rows
of the launch view, like ``nb_accel.tqdm``'s, instead of text in the cell's output; the kernel's
tqdm is left as it was."""

from __future__ import annotations

import pytest
import tqdm
import tqdm.auto
import tqdm.notebook

import nb_accel
from nb_accel._messages import Report
from nb_accel.launch.views.view import NullView, register_view_factory, view_factory


class Recorder(NullView):
    """A launch view that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(self, event: Report) -> None:
        """Keep it."""
        self.reports.append(event)


class LibraryBar(tqdm.notebook.tqdm):  # type: ignore[misc]
    """A library's own bar on top of the notebook's: its ``__init__`` still runs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs["desc"] = "library bar"
        super().__init__(*args, **kwargs)


def plain_bars() -> int:
    total = 0
    for i in tqdm.auto.tqdm(range(40), desc="auto bar"):
        total += i
    with tqdm.tqdm(total=7, desc="std bar", unit="step") as bar:
        bar.update(7)
    for _ in tqdm.tqdm(range(5), desc="silent bar", disable=True):
        pass
    for _ in tqdm.notebook.tqdm(range(3), desc="widget bar"):
        pass
    for _ in LibraryBar(range(2)):
        pass
    return total


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])  # spawn: tqdm.notebook imported late
def test_plain_tqdm_bars_are_reported_not_drawn(
    start_method: str, capfd: pytest.CaptureFixture[str]
) -> None:
    before = dict(vars(tqdm.std.tqdm)), dict(vars(tqdm.notebook.tqdm))
    recorder = Recorder()
    previous = view_factory()
    register_view_factory(lambda title, world_size, all_ranks: recorder)
    try:
        assert nb_accel.notebook_launcher(
            plain_bars, num_processes=2, start_method=start_method
        ) == [780, 780]
    finally:
        register_view_factory(previous)
    output = capfd.readouterr()
    for rank in (0, 1):
        bars = [b for r in recorder.reports if r.rank == rank for b in r.bars]
        final = {b.desc: b for b in bars if b.closed}
        assert final["auto bar"].n == 40 and final["auto bar"].total == 40
        assert final["std bar"].n == 7 and final["std bar"].unit == "step"
        assert final["widget bar"].n == 3  # a text bar, reported like the others
        assert final["library bar"].n == 2
        assert not any(b.desc == "silent bar" for b in bars)
    text = output.out + output.err
    for drawn in ("auto bar", "std bar", "widget bar", "library bar", "it/s", "100%", "Box"):
        assert drawn not in text
    after = dict(vars(tqdm.std.tqdm)), dict(vars(tqdm.notebook.tqdm))
    assert after == before  # the kernel's tqdm is unchanged
