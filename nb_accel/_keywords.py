"""Keyword arguments a constructor has no parameter for, refused as Python refuses them, with
the parameter each was most likely meant to be.

The classes that take ``**kwargs`` (to hand Accelerate's extra options on, as Accelerate's own
do) check what arrives there against the names they accept, so that a misspelled option is a
``TypeError`` instead of being ignored; the launchers, whose parameters are all named, say the
same (``nb_accel.launch.front_door``).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "ACCELERATES_PARAMETERS",
    "closest",
    "parameter_names",
    "refuse_unknown",
    "unknown_keywords_error",
]

#: How the message ends for a class whose parameters are Accelerate's.
ACCELERATES_PARAMETERS = "its parameters are Accelerate's (see help({title}))"


def parameter_names(function: Callable[..., Any]) -> list[str]:
    """The parameters of ``function`` (or a class) that can be given by keyword (``self``,
    ``*args``/``**kwargs`` and positional-only ones left out)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(function).parameters.items()
    return [n for n, p in parameters if p.kind in kinds and n != "self"]


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The one of ``choices`` that ``name`` most likely misspells (``None``: none is close)."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return close[0] if close else None


def refuse_unknown(
    title: str,
    given: Iterable[str],
    known: Iterable[str],
    ending: str = ACCELERATES_PARAMETERS,
) -> None:
    """Raise :func:`unknown_keywords_error`'s ``TypeError``, if any."""
    error = unknown_keywords_error(title, given, known, ending)
    if error is not None:
        raise error


def unknown_keywords_error(
    title: str,
    given: Iterable[str],
    known: Iterable[str],
    ending: str = ACCELERATES_PARAMETERS,
) -> TypeError | None:
    """The ``TypeError`` for the names of ``given`` that are not in ``known``, as Python
    words it for ``title()``, naming the known name each most likely meant; ``ending``
    (formatted with ``title``) says where the parameters are described. ``None``: all known."""
    accepted = set(known)
    names = sorted(name for name in given if name not in accepted)
    if not names:
        return None
    choices = sorted(name for name in accepted if not name.startswith("_"))
    spelled = []
    for name in names:
        close = closest(name, choices)
        spelled.append(f"{name!r} (did you mean {close!r}?)" if close else repr(name))
    what = "an unexpected keyword argument" if len(names) == 1 else "unexpected keyword arguments"
    return TypeError(f"{title}() got {what} {', '.join(spelled)}; {ending.format(title=title)}")
