"""What every public entry point of the launch layer does with its arguments and its errors.

A keyword it has no parameter for is refused naming the parameter most likely meant
(``num_process``: ``num_processes``), and whatever is the user's to read (bad input, a launch
that could not proceed, a worker's exception) is raised from the entry point itself: a script's
traceback shows the user's frames and one frame of ours, named after the function they called,
and a notebook shows their frames only (:func:`~.failures.user_errors.for_the_user`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .._keywords import parameter_names, unknown_keywords_error
from .failures.user_errors import for_the_user, meant_for_the_user

__all__ = ["entry_point"]

_Function = TypeVar("_Function", bound=Callable[..., Any])


def entry_point(function: _Function) -> _Function:
    """``function`` as a public entry point: a keyword argument it has no parameter for is
    refused with the message of :func:`~nb_accel._keywords.unknown_keywords_error` instead of
    Python's bare one, and the user's errors are raised from here, this frame carrying
    ``function``'s name. Its signature and help stay ``function``'s."""
    known = parameter_names(function)
    title = function.__name__

    def entry(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython and pytest leave this frame out
        error: BaseException | None = unknown_keywords_error(
            title, kwargs, known, ending="see help({title}) for its options"
        )
        if error is None:
            try:
                return function(*args, **kwargs)
            except BaseException as raised:
                if not meant_for_the_user(raised):
                    raise  # a defect of ours: its whole traceback
                error = raised
        try:
            raise for_the_user(error) from error.__cause__
        finally:  # the traceback keeps this frame: no name of it may lead back to the error
            error = None

    # A script's traceback names this frame as the function the user called.
    code = entry.__code__.replace(co_name=function.__name__)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=function.__qualname__)
    entry.__code__ = code
    return cast(_Function, functools.update_wrapper(entry, function))
