"""The newcomer's messages, case by case: which returned values are state dicts with a
wrapper's names (and which are not), how a worker's traceback folds nb_accel's frames (chained
exceptions too, never an error raised inside torch), and the flag a misspelled one meant."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from nb_accel import Accelerator
from nb_accel.launch.views.state_dict_note import wrapped_state_dict_note, wrapper_of
from nb_accel.notebook.magic_flags import parse_flags, pool_flags
from nb_accel.worker.process.folded_frames import FULL_TRACEBACKS_VARIABLE, folded_traceback


def test_state_dicts_with_a_wrappers_names() -> None:
    compiled = {"_orig_mod.0.weight": torch.ones(1), "_orig_mod.0.bias": torch.ones(1)}
    checkpointed = {"layers.0._checkpoint_wrapped_module.weight": 1}
    assert wrapper_of({"module.weight": 1, "module.bias": 2}) == "module."
    assert wrapper_of(compiled) == "_orig_mod."
    assert wrapper_of(checkpointed) == "_checkpoint_wrapped_module."
    # plain keys, mixed keys, empty dicts, non-string keys and other values are left alone
    for value in ({"weight": 1}, {"module.weight": 1, "bias": 2}, {}, {1: 2}, [1], "module."):
        assert wrapper_of(value) is None
    assert wrapped_state_dict_note([{"weight": 1}, 3.0]) is None
    note = wrapped_state_dict_note([{"w": 1}, compiled], first_rank=4)
    assert note is not None and note.startswith("rank 5 returned a state dict whose keys all carry")
    assert "(torch.compile's wrapper)" in note and "unwrap_model(model).state_dict()" in note
    note = wrapped_state_dict_note({2: checkpointed, 3: checkpointed})
    assert note is not None and note.startswith("ranks 2, 3 returned state dicts")
    assert note.endswith('drop "_checkpoint_wrapped_module." from its keys before load_state_dict')


def _misuse() -> None:
    Accelerator(cpu=True).save_state()


def _chained() -> None:
    try:
        _misuse()
    except ValueError as error:
        raise RuntimeError("while saving") from error


def _caught(call: object) -> BaseException:
    with pytest.raises(Exception) as info:
        call()  # type: ignore[operator]
    return info.value


def test_nb_accels_frames_fold_in_every_exception_of_a_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(FULL_TRACEBACKS_VARIABLE, raising=False)
    error = _caught(_chained)
    text = folded_traceback(error, error.__traceback__)
    assert text.count("frames of nb_accel left out") == 1  # the cause's; the outer has none
    assert "Accelerator(cpu=True).save_state()" in text and "nb_accel/runtime" not in text
    assert "RuntimeError: while saving" in text and "ValueError: save_state needs" in text
    monkeypatch.setenv(FULL_TRACEBACKS_VARIABLE, "1")
    full = folded_traceback(error, error.__traceback__)
    assert "left out" not in full and "nb_accel/runtime/checkpoint/methods.py" in full


def test_an_error_raised_inside_torch_keeps_every_frame() -> None:
    error = _caught(lambda: torch.nn.Linear(3, 2)(torch.ones(4, 5)))
    text = folded_traceback(error, error.__traceback__)
    assert "left out" not in text and "torch/nn/modules/linear.py" in text


@magic_arguments()
@argument("--ranks")
@pool_flags
def _magic(line: str) -> None:
    """A magic with the pool's flags."""


def test_a_misspelled_flag_names_the_one_meant() -> None:
    assert parse_flags(_magic, "--num-processes 2").num_processes == 2
    with pytest.raises(UsageError, match=r"--mixed-precison: did you mean --mixed-precision\?"):
        parse_flags(_magic, "--mixed-precison=bf16")
    with pytest.raises(UsageError) as info:
        parse_flags(_magic, "--zzzz 3")
    assert str(info.value) == "unrecognized arguments: --zzzz 3"  # nothing close: as argparse
    with pytest.raises(UsageError, match="expected one argument"):
        parse_flags(_magic, "--ranks")


def test_a_torch_older_than_the_floor_is_refused_saying_what_to_do() -> None:
    from nb_accel._env import torch_problem

    problem = torch_problem("2.8.1+cu126")
    assert problem is not None and "needs torch 2.9 or newer" in problem
    assert "torch 2.8.1+cu126" in problem and "pip install -U 'torch>=2.9'" in problem
    assert torch_problem("2.9.0") is None and torch_problem("2.13.0+cpu") is None
    assert torch_problem("3.0.0") is None and torch_problem("2.10.0a0+git") is None
