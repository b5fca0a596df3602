"""A griffe extension for the documentation site: docstrings name objects with Sphinx roles
(``:class:`~nb_accel.Accelerator```), which MkDocs would show as they are written. Each role
becomes inline code: the last part of the path when it starts with ``~``, else the path."""

from __future__ import annotations

import re
from typing import Any

import griffe

#: A Sphinx cross-reference role, with the ``~`` that asks for the last part only.
ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx role turned into inline code."""

    def code(match: re.Match[str]) -> str:
        short, target = match.group(1), match.group(2)
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return ROLE.sub(code, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
