"""Worker output in the kernel: prefixed once a second rank prints; ranks never share a line."""

from __future__ import annotations

import pytest

from nb_accel._messages import Output
from nb_accel.launch.output import OutputPrinter


def test_prefixes_start_with_the_second_rank_and_lines_never_mix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    printer = OutputPrinter(world_size=2)
    printer(Output(0, "stdout", "epoch 1\n"))
    printer(Output(0, "stdout", "loss "))
    printer(Output(1, "stdout", "hello\n"))
    printer(Output(0, "stdout", "0.5\n"))
    printer(Output(1, "stderr", "warning\n"))
    captured = capsys.readouterr()
    assert captured.out == "epoch 1\nloss \n[rank 1] hello\n[rank 0] 0.5\n"
    assert captured.err == "[rank 1] warning\n"


def test_one_printing_rank_and_turned_off_prefixes_stay_plain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    alone = OutputPrinter(world_size=4)
    for line in ("a\n", "b\n"):
        alone(Output(0, "stdout", line))
    plain = OutputPrinter(world_size=2, prefix=False)
    plain(Output(0, "stdout", "x\n"))
    plain(Output(1, "stdout", "y\n"))
    assert capsys.readouterr().out == "a\nb\nx\ny\n"
