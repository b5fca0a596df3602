"""What Accelerate's tests import from ``accelerate.test_utils``, for their runs on nb_accel.

The fixtures that do not touch Accelerate's state (``RegressionModel``, ``RegressionDataset``,
``assert_exception``, the ``require_*`` decorators, ...) are taken as they are from the
installed ``accelerate`` package. The two that do are pointed at nb_accel instead:
``are_the_same_tensors`` gathers through nb_accel, and ``AccelerateTestCase`` resets nb_accel's
states after each test, as Accelerate's resets its own.

One fixture is made repeatable: ``RegressionDataset`` without a seed draws fresh data on every
run, and ``test_sync.py`` then fails on about one dataset in a thousand, on Accelerate as on
nb_accel (a gradient that nearly cancels differs by more than ``allclose``'s tolerance between
two orders of summation; ``tests/multiproc/test_accelerate_arithmetic.py`` shows both sides
compute the same floats). Here it takes a fixed seed when given none.
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


#: The seed ``RegressionDataset`` takes when its caller gives none.
DATASET_SEED = 0


def RegressionDataset(*args: Any, **kwargs: Any) -> Any:
    """Accelerate's ``RegressionDataset``, with :data:`DATASET_SEED` when no seed is given."""
    from accelerate.test_utils import RegressionDataset as accelerate_dataset

    if len(args) < 4 and kwargs.get("seed") is None:
        kwargs["seed"] = DATASET_SEED
    return accelerate_dataset(*args, **kwargs)


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
