"""Yes/no values of options and environment variables, read one way everywhere.

The words are Accelerate's (``1``/``0``, ``true``/``false``, ``yes``/``no``, ``y``/``n``,
``on``/``off``, ``t``/``f``, in any case). A value that is none of them is an error that names the
option or variable, never a silent ``False``.
"""

from __future__ import annotations

import os

__all__ = ["TRUE_WORDS", "FALSE_WORDS", "parse_flag", "env_flag"]

#: The words that mean yes.
TRUE_WORDS = ("1", "true", "yes", "y", "on", "t")
#: The words that mean no.
FALSE_WORDS = ("0", "false", "no", "n", "off", "f")


def parse_flag(value: object, name: str, hint: str = "use true or false") -> bool:
    """``value`` (a bool, or one of the yes/no words) as a bool.

    Args:
        value: what was given or read.
        name: the option or variable it was given as, for the error.
        hint: what the error says to do instead.

    Raises:
        ValueError: ``value`` is neither a yes word nor a no word.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={value!r} is not a yes/no value ({hint})")


def env_flag(name: str, default: bool | None = None, hint: str = "use 1 or 0") -> bool | None:
    """The environment variable ``name`` as a bool; ``default`` when it is unset or empty.

    Raises:
        ValueError: it is set to something that is neither yes nor no.
    """
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    return parse_flag(value, name, hint)
