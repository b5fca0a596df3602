"""Functions shipped to the workers keep their source's name in tracebacks.

cloudpickle (3.1.3 on) replaces the file name of every code object it pickles by value with
``"<dynamic-code>"``, so a worker's traceback would no longer say ``Cell In[7], line 3`` or
name the user's script. Here the code objects are pickled by cloudpickle's own reducer and
then given their file name back; nothing else changes.
"""

from __future__ import annotations

import io
import os
import pickle
import sysconfig
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle

from nb_accel.worker.transfer.submodules import remember_submodules

__all__ = ["LIBRARY_ROOTS", "CodePickler", "dumps", "installed_code"]

#: Folders of code that is not the user's: installed packages, the standard library; the
#: longest first (a virtual environment's packages lie inside its own ``platstdlib``).
LIBRARY_ROOTS = tuple(
    sorted(
        {
            os.path.realpath(path)
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (path := sysconfig.get_paths().get(key))
        },
        key=len,
        reverse=True,
    )
)
#: nb_accel's own folder (an editable install lies outside the installed packages).
_PACKAGE_ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def installed_code(path: str) -> bool:
    """Whether the file ``path`` is the standard library's, an installed package's or
    nb_accel's, not the user's own."""
    real = os.path.realpath(path)
    return any(real.startswith(root + os.sep) for root in (_PACKAGE_ROOT, *LIBRARY_ROOTS))


#: What cloudpickle writes in place of a code object's file name.
_PLACEHOLDER = "<dynamic-code>"
_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]
remember_submodules()  # cloudpickle's search of sys.modules, once per set of modules


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
