"""GPU tests see the machine's GPUs: the suite-wide CPU switch is lifted while each runs.

Nothing here initialises CUDA in the pytest process: a test that needs CUDA in the process
that launches (to show what a kernel that used CUDA gets) runs that part in a subprocess.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def gpus_visible(no_leftovers: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unset ``NB_ACCEL_USE_CPU`` for the test (restored before the leftovers check)."""
    monkeypatch.delenv("NB_ACCEL_USE_CPU", raising=False)
    yield
