"""The wheel a user would install, built once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest
from built_wheel import build_wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of the wheel built from this working tree."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))
