"""Pickled objects as byte rows of a few fixed widths, for the object collectives on XLA.

XLA compiles one graph per tensor shape. Objects travel between ranks as their pickled bytes in
a ``uint8`` tensor; were that tensor exactly as long as the pickle, every new payload size
would compile a new graph (seconds each on a TPU), and a loop that gathers a few strings or
metrics would recompile at every step. Each payload is instead padded to a width taken from a
short ladder (:func:`row_width`), so repeated collectives of varying sizes reuse the few graphs
compiled for those widths.

Plain Python and torch: importing this module does not import ``torch_xla``.
"""

from __future__ import annotations

import torch

__all__ = ["SMALLEST_ROW", "QUARTERS_FROM", "row_width", "pack_row", "unpack_rows"]

#: The narrowest row (bytes): every payload up to this size shares one graph.
SMALLEST_ROW = 1024
#: From this width on, rows grow in quarters of a power of two rather than by doubling, so
#: padding never adds more than a quarter to a large payload.
QUARTERS_FROM = 1 << 20


def row_width(size: int) -> int:
    """The width (bytes) of the row that carries a payload of ``size`` bytes.

    The smallest power of two that holds it, and at least :data:`SMALLEST_ROW`; past
    :data:`QUARTERS_FROM`, the next multiple of a quarter of the largest power of two below
    ``size`` (at most four widths per doubling). Every rank computes the same width from the
    same largest size.
    """
    if size < 0:
        raise ValueError(f"a payload cannot have {size} bytes")
    if size <= QUARTERS_FROM:
        return max(SMALLEST_ROW, 1 << (size - 1).bit_length()) if size else SMALLEST_ROW
    quarter = (1 << (size - 1).bit_length() - 1) // 4
    return -(-size // quarter) * quarter


def pack_row(payload: bytes, width: int) -> torch.Tensor:
    """``payload`` as a ``uint8`` tensor of ``width`` bytes, zero-padded at the end."""
    if len(payload) > width:
        raise ValueError(f"a payload of {len(payload)} bytes does not fit a row of {width}")
    row = torch.zeros(width, dtype=torch.uint8)
    if payload:
        row[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return row


def unpack_rows(rows: torch.Tensor, sizes: list[int]) -> list[bytes]:
    """Every rank's payload from the gathered ``rows`` (one row per rank, concatenated or
    stacked) and every rank's payload size."""
    flat = rows.reshape(len(sizes), -1)
    return [flat[rank, :size].numpy().tobytes() for rank, size in enumerate(sizes)]
