"""The text view names ranks by their global number, also on a node of a multi-node launch."""

from __future__ import annotations

import io

from nb_accel.launch.text_view import TextView


def test_failures_name_the_global_rank_on_a_later_node() -> None:
    stream = io.StringIO()
    view = TextView(2, stream=stream, first_rank=2)
    view.failed(1, "ValueError: bad batch")
    assert "rank 3 failed: ValueError: bad batch" in stream.getvalue()


def test_on_one_node_ranks_are_counted_from_zero() -> None:
    stream = io.StringIO()
    view = TextView(2, stream=stream)
    view.failed(1, "ValueError: bad batch")
    assert "rank 1 failed: ValueError: bad batch" in stream.getvalue()
