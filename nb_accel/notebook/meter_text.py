"""tqdm's text for a bar, and the durations the launch view writes."""

from __future__ import annotations

import math

from .._messages import BarState

__all__ = ["format_interval", "format_meter", "count_text", "duration_text", "known_total"]


def format_interval(seconds: float) -> str:
    """``MM:SS``, or ``H:MM:SS`` from an hour on, as tqdm writes times."""
    minutes, secs = divmod(int(max(seconds, 0.0)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def duration_text(seconds: float, precise: bool = False) -> str:
    """``"42 s"`` (``"41.7 s"`` when ``precise``) under a minute, else ``MM:SS``/``H:MM:SS``."""
    if seconds < 60:
        return f"{seconds:.1f} s" if precise else f"{int(seconds)} s"
    return format_interval(seconds)


def count_text(n: float) -> str:
    """A bar's count as tqdm writes it: whole numbers without a fraction."""
    return str(int(n)) if float(n).is_integer() else f"{n:.6g}"


def known_total(state: BarState) -> bool:
    """True when the bar has a finite, positive total (so a percentage means something)."""
    return state.total is not None and 0 < state.total < math.inf


def format_meter(state: BarState) -> str:
    """tqdm's text for a bar: ``n/total [elapsed<remaining, rate, postfix]``, or without a total
    ``n [elapsed, rate, postfix]``. Without a smoothed rate (tqdm drops it when a bar closes)
    the rate is the average over the elapsed time, as tqdm shows it."""
    speed = state.rate
    if speed is None and state.elapsed > 0:
        speed = state.n / state.elapsed
    if not speed:
        rate = f"?{state.unit}/s"
    elif speed < 1:
        rate = f"{1 / speed:.2f}s/{state.unit}"
    else:
        rate = f"{speed:.2f}{state.unit}/s"
    postfix = state.postfix.strip().lstrip(",").strip()
    tail = f", {postfix}" if postfix else ""
    elapsed = format_interval(state.elapsed)
    if state.total is None or not known_total(state):
        return f"{count_text(state.n)} [{elapsed}, {rate}{tail}]"
    remaining = format_interval((state.total - state.n) / speed) if speed else "?"
    return f"{count_text(state.n)}/{count_text(state.total)} [{elapsed}<{remaining}, {rate}{tail}]"
