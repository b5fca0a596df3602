"""What every public entry point of the launch layer does with its arguments before anything
else: a keyword it has no parameter for is refused naming the parameter most likely meant
(``num_process``: ``num_processes``), raised as the user's error (their frames, our message)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .._keywords import parameter_names, unknown_keywords_error
from .failures.user_errors import for_the_user

__all__ = ["suggesting_keywords"]

_Function = TypeVar("_Function", bound=Callable[..., Any])


def suggesting_keywords(function: _Function) -> _Function:
    """``function``, refusing a keyword argument it has no parameter for with the message of
    :func:`~nb_accel._keywords.unknown_keywords_error` instead of Python's bare one. Its
    signature and help stay ``function``'s."""
    known = parameter_names(function)
    title = function.__name__

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython and pytest leave this frame out
        error = unknown_keywords_error(
            title, kwargs, known, ending="see help({title}) for its options"
        )
        if error is not None:
            raise for_the_user(error)
        return function(*args, **kwargs)

    return cast(_Function, checked)
