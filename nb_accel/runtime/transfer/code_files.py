"""Functions shipped to the workers keep their source's name in tracebacks.

cloudpickle (3.1.3 on) replaces the file name of every code object it pickles by value with
``"<dynamic-code>"``, so a worker's traceback would no longer say ``Cell In[7], line 3`` or
name the user's script. Here the code objects are pickled by cloudpickle's own reducer and
then given their file name back; nothing else changes.
"""

from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle

__all__ = ["CodePickler", "dumps"]

#: What cloudpickle writes in place of a code object's file name.
_PLACEHOLDER = "<dynamic-code>"
_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_reduce(code: types.CodeType) -> Any:
    constructor, args = _cloudpickle_code_reduce(code)
    if code.co_filename != _PLACEHOLDER:
        args = tuple(
            code.co_filename if isinstance(arg, str) and arg == _PLACEHOLDER else arg
            for arg in args
        )
    return constructor, args


class CodePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, with code objects keeping their file names."""

    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table
    )


def dumps(obj: Any, protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    """``cloudpickle.dumps(obj)``, the code of functions pickled by value keeping its file
    names (a worker's traceback then names the user's cell or file)."""
    buffer = io.BytesIO()
    CodePickler(buffer, protocol=protocol).dump(obj)
    return buffer.getvalue()
