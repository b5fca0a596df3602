"""Worker output in the kernel: prefixed from the first line when several ranks' output is shown,
ranks never share a line, and output is written in batches that keep every rank's order."""

from __future__ import annotations

import pytest

from nb_accel._messages import Output
from nb_accel.launch.views.output import FLUSH_INTERVAL_S, MAX_SEGMENTS, OutputPrinter
from nb_accel.launch.views.view import NullView


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal:
    """stdout and stderr in one record: (stream, text) per write, and each flush."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def stream(self, name: str) -> Stream:
        return Stream(self, name)


class Stream:
    def __init__(self, terminal: Terminal, name: str) -> None:
        self._terminal, self._name = terminal, name

    def write(self, text: str) -> int:
        self._terminal.log.append((self._name, text))
        return len(text)

    def flush(self) -> None:
        self._terminal.log.append((self._name, "<flush>"))


def capture(monkeypatch: pytest.MonkeyPatch) -> Terminal:
    """stdout and stderr recorded together (set in the test itself: pytest's own capture
    replaces them again between a fixture and the test)."""
    shared = Terminal()
    monkeypatch.setattr("sys.stdout", shared.stream("out"))
    monkeypatch.setattr("sys.stderr", shared.stream("err"))
    return shared


def written(terminal: Terminal, name: str | None = None) -> str:
    return "".join(t for n, t in terminal.log if t != "<flush>" and name in (None, n))


def test_prefixes_start_with_the_first_line_and_lines_never_mix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    printer = OutputPrinter(world_size=2)
    printer(Output(0, "stdout", "epoch 1\n"))
    printer(Output(0, "stdout", "loss "))
    printer(Output(1, "stdout", "hello\n"))
    printer(Output(0, "stdout", "0.5\n"))
    printer(Output(1, "stderr", "warning\n"))
    printer.flush()
    captured = capsys.readouterr()
    assert captured.out == "[rank 0] epoch 1\n[rank 0] loss \n[rank 1] hello\n[rank 0] 0.5\n"
    assert captured.err == "[rank 1] warning\n"


def test_one_shown_rank_and_turned_off_prefixes_stay_plain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    alone = OutputPrinter(world_size=1)
    for line in ("a\n", "b\n"):
        alone(Output(0, "stdout", line))
    alone.flush()
    plain = OutputPrinter(world_size=2, prefix=False)
    plain(Output(0, "stdout", "x\n"))
    plain(Output(1, "stdout", "y\n"))
    plain.flush()
    assert capsys.readouterr().out == "a\nb\nx\ny\n"


@pytest.mark.timeout(30)
def test_a_prefix_template_is_filled_in_per_rank_as_torchs_agent_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    template = "[${role_name}${rank}|${local_rank}]$$ "
    printer = OutputPrinter(world_size=4, template=template, per_node=2)
    printer(Output(3, "stdout", "a\nb"))
    printer(Output(3, "stdout", " still b\n"))
    printer(Output(0, "stderr", "warning\n"))
    printer.flush()
    captured = capsys.readouterr()
    assert captured.out == "[default_role3|1]$ a\n[default_role3|1]$ b still b\n"
    assert captured.err == "[default_role0|0]$ warning\n"


@pytest.mark.timeout(30)
def test_a_prefix_template_replaces_the_host_and_applies_to_one_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hosts = OutputPrinter(4, place_of=lambda rank: f"node{rank // 2}", template="${rank}: ")
    hosts(Output(2, "stdout", "x\n"))
    hosts.flush()
    alone = OutputPrinter(1, template="<${local_rank}>")
    alone(Output(0, "stdout", "y\n"))
    alone.flush()
    unset = OutputPrinter(2, place_of=lambda rank: "gpu0", template="")  # torch: no template
    unset(Output(1, "stdout", "z\n"))
    unset.flush()
    assert capsys.readouterr().out == "2: x\n<0>y\n[gpu0 rank 1] z\n"


def test_a_burst_is_written_in_one_batch_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = capture(monkeypatch)
    clock = Clock()
    printer = OutputPrinter(2, clock=clock)
    printer(Output(0, "stdout", "first\n"))  # after a quiet spell: at once
    assert written(terminal) == "[rank 0] first\n"
    for i in range(1000):
        printer(Output(i % 2, "stdout", f"line {i}\n"))
    assert written(terminal) == "[rank 0] first\n"  # held
    clock.now += FLUSH_INTERVAL_S / 2
    due = printer.flush_due()
    assert due == pytest.approx(FLUSH_INTERVAL_S / 2)
    clock.now += FLUSH_INTERVAL_S
    assert printer.flush_due() is None
    assert printer.flush_due() is None  # nothing held any more
    assert [t for _, t in terminal.log].count("<flush>") == 2  # two writes, two messages
    lines = written(terminal).splitlines()
    assert lines == ["[rank 0] first"] + [f"[rank {i % 2}] line {i}" for i in range(1000)]


def test_stdout_and_stderr_keep_their_order_within_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = capture(monkeypatch)
    clock = Clock()
    printer = OutputPrinter(1, clock=clock)
    printer(Output(0, "stdout", "start\n"))
    printer(Output(0, "stdout", "a\n"))
    printer(Output(0, "stderr", "warn\n"))
    printer(Output(0, "stdout", "b\n"))
    printer.flush()
    text = [(n, t) for n, t in terminal.log if t != "<flush>"]
    assert text == [("out", "start\n"), ("out", "a\n"), ("err", "warn\n"), ("out", "b\n")]


def test_many_stream_switches_keep_each_streams_order_and_bound_the_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = capture(monkeypatch)
    clock = Clock()
    printer = OutputPrinter(1, clock=clock)
    printer(Output(0, "stdout", "start\n"))
    for i in range(100):
        printer(Output(0, "stdout" if i % 2 == 0 else "stderr", f"{i}\n"))
    terminal.log.clear()
    printer.flush()
    assert sum(t == "<flush>" for _, t in terminal.log) == MAX_SEGMENTS
    assert written(terminal, "out").split() == [str(i) for i in range(0, 100, 2)]
    assert written(terminal, "err").split() == [str(i) for i in range(1, 100, 2)]


class RecordingView(NullView):
    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal

    def failed(self, rank: int, summary: str) -> None:
        self.terminal.log.append(("view", f"rank {rank} failed"))

    def finished(self, ok: bool) -> None:
        self.terminal.log.append(("view", "finished"))


def test_held_output_is_written_before_the_view_changes_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = capture(monkeypatch)
    clock = Clock()
    printer = OutputPrinter(2, view=RecordingView(terminal), clock=clock)
    printer(Output(1, "stdout", "before\n"))
    printer(Output(1, "stderr", "traceback\n"))
    printer.view.failed(1, "ValueError")
    printer(Output(0, "stdout", "last words\n"))
    printer.view.finished(False)
    text = [t for _, t in terminal.log if t != "<flush>"]
    assert text == [
        "[rank 1] before\n",
        "[rank 1] traceback\n",
        "rank 1 failed",
        "[rank 0] last words\n",
        "finished",
    ]


class Bar(NullView):
    """A view drawing a bar on the terminal (the TerminalBar calls recorded)."""

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal

    def clear_bar(self) -> None:
        self.terminal.log.append(("bar", "clear"))

    def redraw_bar(self) -> None:
        self.terminal.log.append(("bar", "redraw"))


def test_a_bar_is_cleared_before_output_and_redrawn_after_complete_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = capture(monkeypatch)
    clock = Clock()
    printer = OutputPrinter(1, view=Bar(terminal), clock=clock)
    printer(Output(0, "stdout", "line\n"))
    printer(Output(0, "stdout", "partial"))
    printer.flush()
    printer(Output(0, "stdout", " done\n"))
    printer.flush()
    text = [t for _, t in terminal.log if t != "<flush>"]
    assert text == ["clear", "line\n", "redraw", "clear", "partial", "clear", " done\n", "redraw"]
