"""cloudpickle's submodule search, remembered while ``sys.modules`` keeps its names
(``nb_accel/worker/transfer/submodules.py``)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from nb_accel.worker.transfer import code_files
from nb_accel.worker.transfer.submodules import (
    CLOUDPICKLE_MODULE,
    SubmoduleMemo,
    remember_submodules,
)

pytestmark = pytest.mark.timeout(60)


def _package(name: str) -> types.ModuleType:
    package = types.ModuleType(name)
    package.__package__ = name
    package.__path__ = []
    return package


def _uses_sub(package: Any) -> Any:
    return package.sub.value


class _Counted:
    """cloudpickle's own search, counting its calls."""

    def __init__(self) -> None:
        memo = remember_submodules()
        assert memo is not None
        self.search = memo.search
        self.calls = 0

    def __call__(self, code: types.CodeType, dependencies: Any) -> Any:
        self.calls += 1
        return self.search(code, dependencies)


def test_the_memo_sees_a_submodule_imported_after_its_first_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    package = _package("nb_accel_memo_pkg")
    monkeypatch.setitem(sys.modules, package.__name__, package)
    search = _Counted()
    memo = SubmoduleMemo(search)
    code = _uses_sub.__code__

    assert memo(code, iter([package, 3])) == []
    assert memo(code, [package]) == []
    assert search.calls == 1  # the second answer came from memory

    sub = types.ModuleType("nb_accel_memo_pkg.sub")
    monkeypatch.setitem(sys.modules, sub.__name__, sub)
    assert memo(code, [package]) == [sub]
    assert search.calls == 2

    monkeypatch.delitem(sys.modules, sub.__name__)
    assert memo(code, [package]) == []


def test_functions_pickled_by_value_still_carry_their_submodules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    package = _package("nb_accel_memo_pkg2")
    sub = types.ModuleType("nb_accel_memo_pkg2.sub")
    sub.value = 42  # type: ignore[attr-defined]
    package.sub = sub  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, package.__name__, package)
    monkeypatch.setitem(sys.modules, sub.__name__, sub)
    namespace: dict[str, Any] = {"pkg": package, "__name__": "__main__"}
    exec("def read():\n    return pkg.sub.value\n", namespace)
    read = namespace["read"]

    first = code_files.dumps(read)
    again = code_files.dumps(read)  # answered from memory
    assert first == again
    assert b"nb_accel_memo_pkg2.sub" in again


def test_the_memo_is_installed_once_in_front_of_cloudpickles_search() -> None:
    memo = remember_submodules()
    assert isinstance(memo, SubmoduleMemo)
    assert CLOUDPICKLE_MODULE._find_imported_submodules is memo
    assert remember_submodules() is memo
    assert not isinstance(memo.search, SubmoduleMemo)
