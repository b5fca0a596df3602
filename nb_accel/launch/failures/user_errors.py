"""Exceptions as the user sees them: raised from the public entry point, without our frames.

Whatever goes wrong inside the package (a bad argument found three calls deep, a worker's
exception, an interrupt that landed inside a widget update) reaches the user through
:func:`for_the_user`: its traceback starts at the entry point they called, so a script prints
their own frames and one frame of ours, and where a front end registered a renderer (the
notebook does, see ``nb_accel.notebook.tracebacks``) the exception renders itself without any
of the package's frames, its worker-side traceback still shown as its cause.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ...errors import NbAccelError

__all__ = [
    "USER_ERRORS",
    "TracebackRenderer",
    "for_the_user",
    "meant_for_the_user",
    "register_traceback_renderer",
]

#: What an entry point re-raises as the user's error: bad input found before anything started
#: (TypeError, ValueError, a missing optional package), a launch that could not proceed or
#: whose workers failed (every :class:`~nb_accel.errors.NbAccelError`), and an interrupt. Any
#: other exception is a defect of ours and keeps its full traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    ValueError,
    ImportError,
    NbAccelError,
    KeyboardInterrupt,
)

#: ``renderer(error, kernel_frames) -> lines``: the error's traceback as a front end shows it.
TracebackRenderer = Callable[[BaseException, bool], list[str]]

_renderer: TracebackRenderer | None = None


def register_traceback_renderer(renderer: TracebackRenderer | None) -> None:
    """Render exceptions passed to :func:`for_the_user` with ``renderer`` (one per process)."""
    global _renderer  # noqa: PLW0603 - one front end per process
    _renderer = renderer


def meant_for_the_user(error: BaseException) -> bool:
    """Whether ``error`` is the user's to read (bad input, a launch that could not proceed,
    an interrupt, or a worker's failure re-raised in the kernel), not a defect of ours."""
    return isinstance(error, USER_ERRORS) or getattr(error, "nb_accel_failures", None) is not None


def for_the_user(error: BaseException, kernel_frames: bool = True) -> BaseException:
    """``error``, ready to be raised at a public entry point.

    Its traceback is dropped (raising it again starts a new one at the raise), the context of
    an interrupt (whatever our code was doing when it landed) is suppressed, and a registered
    renderer is attached as IPython's ``_render_traceback_`` hook. With ``kernel_frames=False``
    no frame of the kernel is shown at all (for cell magics, whose only frames are IPython's
    and ours); the cause, e.g. a worker-side traceback, always is.
    """
    error.__traceback__ = None
    if isinstance(error, KeyboardInterrupt):
        error.__suppress_context__ = True
    renderer = _renderer
    if renderer is not None:
        try:
            error._render_traceback_ = _Rendering(renderer, id(error), kernel_frames)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):  # an exception type without instance attributes
            pass
    return error


class _Rendering:
    """An exception's ``_render_traceback_`` hook that does not hold the exception.

    A hook holding its exception (a closure, a bound method) would make the two a reference
    cycle, and keep the exception's traceback, its frames and everything they hold until the
    garbage collector runs; exceptions cannot be weakly referenced. The hook keeps the
    exception's ``id`` instead and finds it where IPython keeps the exception it is showing
    (``sys.last_value``, or the one being handled): a live object with that ``id`` can only be
    the hook's own exception.
    """

    def __init__(self, renderer: TracebackRenderer, error_id: int, kernel_frames: bool) -> None:
        self._renderer = renderer
        self._error_id = error_id
        self._kernel_frames = kernel_frames

    def __call__(self) -> list[str]:
        """The exception's traceback as the registered renderer shows it."""
        candidates = (
            getattr(sys, "last_value", None),
            getattr(sys, "last_exc", None),
            sys.exc_info()[1],
        )
        for error in candidates:
            if error is not None and id(error) == self._error_id:
                return self._renderer(error, self._kernel_frames)
        raise LookupError(
            "the exception to render is neither the last one shown nor the one being handled; "
            "format it with the traceback module instead"
        )
