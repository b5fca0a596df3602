"""Yes/no options and environment variables are read one way: Accelerate's words, and an error
naming the variable for anything else (never a silent ``False``)."""

from __future__ import annotations

import pytest

from nb_accel import FullyShardedDataParallelPlugin
from nb_accel._flags import FALSE_WORDS, TRUE_WORDS, env_flag, parse_flag
from nb_accel.runtime.device_backends.shape_checks import debug_mode
from nb_accel.runtime.environment import is_rich_available
from nb_accel.runtime.training.compile import TorchDynamoPlugin


@pytest.mark.parametrize("word", [*TRUE_WORDS, "TRUE", " Yes "])
def test_every_yes_word_is_true(word: str) -> None:
    assert parse_flag(word, "X") is True


@pytest.mark.parametrize("word", [*FALSE_WORDS, "FALSE", " Off "])
def test_every_no_word_is_false(word: str) -> None:
    assert parse_flag(word, "X") is False


def test_an_unset_or_empty_variable_takes_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NB_ACCEL_TEST_FLAG", raising=False)
    assert env_flag("NB_ACCEL_TEST_FLAG") is None
    monkeypatch.setenv("NB_ACCEL_TEST_FLAG", " ")
    assert env_flag("NB_ACCEL_TEST_FLAG", default=True) is True


@pytest.mark.parametrize(
    ("variable", "named", "read"),
    [
        ("ACCELERATE_DEBUG_MODE", "ACCELERATE_DEBUG_MODE", debug_mode),
        ("ACCELERATE_ENABLE_RICH", "ACCELERATE_ENABLE_RICH", is_rich_available),
        (
            "ACCELERATE_DYNAMO_USE_FULLGRAPH",
            "ACCELERATE_DYNAMO_USE_FULLGRAPH",
            lambda: TorchDynamoPlugin(backend="eager"),
        ),
        (
            "FSDP_CPU_RAM_EFFICIENT_LOADING",
            "cpu_ram_efficient_loading",
            FullyShardedDataParallelPlugin,
        ),
    ],
)
def test_a_value_that_is_neither_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, named: str, read: object
) -> None:
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ValueError, match=f"{named}='maybe' is not a yes/no value"):
        read()  # type: ignore[operator]
