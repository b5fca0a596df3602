"""Object payloads on XLA travel in rows of a few widths, so collectives reuse compiled graphs."""

from __future__ import annotations

import pickle

import pytest
import torch

from nb_accel.runtime.xla.object_rows import (
    QUARTERS_FROM,
    SMALLEST_ROW,
    pack_row,
    row_width,
    unpack_rows,
)


@pytest.mark.parametrize(
    ("size", "width"),
    [
        (0, 1024),
        (1, 1024),
        (1024, 1024),
        (1025, 2048),
        (3000, 4096),
        (4096, 4096),
        (1 << 20, 1 << 20),
        ((1 << 20) + 1, (1 << 20) + (1 << 18)),  # a quarter more, not double
        (3 << 20, 3 << 20),
        ((3 << 20) + 5, (3 << 20) + (1 << 19)),
        ((1 << 30) - 1, 1 << 30),
    ],
)
def test_row_width_examples(size: int, width: int) -> None:
    assert row_width(size) == width


def test_payloads_of_every_small_size_share_eleven_widths() -> None:
    widths = {row_width(size) for size in range(0, QUARTERS_FROM + 1)}
    assert widths == {SMALLEST_ROW << k for k in range(11)}


def test_a_row_holds_its_payload_and_adds_at_most_a_quarter_past_one_mebibyte() -> None:
    for size in [*range(0, 5000, 7), *range(QUARTERS_FROM - 3, QUARTERS_FROM + 10**7, 99_991)]:
        width = row_width(size)
        assert width >= size
        if size > QUARTERS_FROM:
            assert width <= size * 1.25 + 1
    # at most four widths for each doubling past the point where quarters start
    widths = {row_width(size) for size in range(QUARTERS_FROM + 1, 2 * QUARTERS_FROM + 1, 997)}
    assert len(widths) == 4


def test_row_width_refuses_a_negative_size() -> None:
    with pytest.raises(ValueError, match="-1 bytes"):
        row_width(-1)


def test_rows_round_trip_every_rank_payload() -> None:
    payloads = [pickle.dumps(value) for value in ({"loss": 0.5}, "x" * 3000, None)]
    width = row_width(max(len(p) for p in payloads))
    rows = torch.cat([pack_row(p, width) for p in payloads])  # as all_gather concatenates them
    assert rows.shape == (3 * width,)
    unpacked = unpack_rows(rows, [len(p) for p in payloads])
    assert unpacked == payloads
    assert [pickle.loads(p) for p in unpacked] == [{"loss": 0.5}, "x" * 3000, None]


def test_pack_row_refuses_a_payload_wider_than_the_row() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        pack_row(b"x" * 10, 8)
