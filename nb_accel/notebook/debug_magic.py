"""``%debug`` after a failed launch or ``%%distributed`` cell: the debugger on the rank's frames.

IPython's ``%debug`` opens pdb on the last error's traceback in the kernel; for a failure that
happened on a rank, those are nb_accel's frames, not the user's. :func:`install_debug_magic`
puts a ``%debug`` in front of IPython's that opens the post-mortem of the rank where the last
error was raised (its prompts in the notebook's input box) when the shell's last error is such
a failure, and hands every other use (an ordinary error, ``%debug`` with arguments, the
``%%debug`` cell magic) to IPython's own.
"""

from __future__ import annotations

import sys
from typing import Any

from ..launch.debugging.kept_rank import RankEndedError
from ..launch.debugging.post_mortems import post_mortem_for

__all__ = ["current_shell", "install_debug_magic"]

_MARK = "_nb_accel_debug"


def _last_error() -> object:
    """The last error the shell showed (as IPython's ``%debug`` reads it)."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def current_shell() -> Any:
    """The IPython shell this process runs, or ``None`` (a script, a worker)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def install_debug_magic(shell: Any) -> None:
    """Put nb_accel's ``%debug`` in front of ``shell``'s own (once; see the module)."""
    if shell is None:
        return
    original = shell.find_line_magic("debug")
    if original is None or getattr(original, _MARK, False):
        return

    def debug(line: str = "") -> Any:
        """%debug: after a failed launch or %%distributed cell, the debugger on the rank where
        it was raised; otherwise IPython's %debug."""
        found = post_mortem_for(_last_error()) if not line.strip() else None
        if found is None:
            return original(line)
        try:
            found.inspect_rank()
        except RankEndedError as ended:
            from IPython.core.error import UsageError  # the shell's own: IPython is loaded

            raise UsageError(str(ended)) from None
        return None

    setattr(debug, _MARK, True)
    shell.register_magic_function(debug, "line", "debug")
