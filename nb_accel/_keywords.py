"""Keyword arguments a constructor has no parameter for, refused as Python refuses them, with
the parameter each was most likely meant to be.

The classes that take ``**kwargs`` (to hand Accelerate's extra options on, as Accelerate's own
do) check what arrives there against the names they accept, so that a misspelled option is a
``TypeError`` instead of being ignored.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["ACCELERATES_PARAMETERS", "parameter_names", "refuse_unknown"]

#: How the message ends for a class whose parameters are Accelerate's.
ACCELERATES_PARAMETERS = "its parameters are Accelerate's (see help({title}))"


def parameter_names(function: Callable[..., Any]) -> list[str]:
    """The parameters of ``function`` (or a class) that can be given by keyword (``self``,
    ``*args``/``**kwargs`` and positional-only ones left out)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(function).parameters.items()
    return [n for n, p in parameters if p.kind in kinds and n != "self"]


def refuse_unknown(
    title: str,
    given: Iterable[str],
    known: Iterable[str],
    ending: str = ACCELERATES_PARAMETERS,
) -> None:
    """Raise ``TypeError`` for the names of ``given`` that are not in ``known``, as Python
    does for ``title()``, naming the known name each most likely meant; ``ending`` (formatted
    with ``title``) says where the parameters are described."""
    accepted = set(known)
    names = sorted(name for name in given if name not in accepted)
    if not names:
        return
    choices = sorted(name for name in accepted if not name.startswith("_"))
    spelled = []
    for name in names:
        close = difflib.get_close_matches(name, choices, n=1)
        spelled.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    what = "an unexpected keyword argument" if len(names) == 1 else "unexpected keyword arguments"
    raise TypeError(f"{title}() got {what} {', '.join(spelled)}; {ending.format(title=title)}")
