"""What Accelerate's tests import from ``accelerate.test_utils``, for their runs on nb_accel.

The fixtures that do not touch Accelerate's state (``RegressionModel``, ``RegressionDataset``,
``assert_exception``, the ``require_*`` decorators, ...) are taken as they are from the
installed ``accelerate`` package. The two that do are pointed at nb_accel instead:
``are_the_same_tensors`` gathers through nb_accel, and ``AccelerateTestCase`` resets nb_accel's
states after each test, as Accelerate's resets its own.
"""

from __future__ import annotations

import importlib
import unittest
from typing import Any

import torch

from nb_accel.runtime.state import reset_all_states
from nb_accel.utils import gather

_SOURCES = (
    "accelerate.test_utils",
    "accelerate.test_utils.testing",
    "accelerate.test_utils.training",
)


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Whether every process passed an equal tensor (gathered through nb_accel)."""
    from nb_accel import PartialState

    mine = tensor[None].clone().to(PartialState().device)
    everyone = gather(mine).cpu()
    return all(torch.equal(row, mine[0].cpu()) for row in everyone)


class AccelerateTestCase(unittest.TestCase):
    """A test case that resets nb_accel's process states after every test."""

    def tearDown(self) -> None:
        """Forget the states the test created, so the next test starts afresh."""
        super().tearDown()
        reset_all_states()


def __getattr__(name: str) -> Any:
    """Every other name comes from Accelerate's own test utilities."""
    for source in _SOURCES:
        module = importlib.import_module(source)
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"accelerate.test_utils has no {name!r}")
