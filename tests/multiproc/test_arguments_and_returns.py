"""What goes into a launch and what comes back: checked where the mistake is made."""

from __future__ import annotations

import psutil
import pytest
import torch
import torch.distributed as dist

from nb_accel import Accelerator, notebook_launcher


def train(lr: float, epochs: int = 3) -> float:
    return lr * epochs


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        ((), None, "missing a required argument: 'lr'"),
        ((0.1, 3, 4), None, "too many positional arguments"),
        ((0.1,), {"batch_size": 8}, "unexpected keyword argument 'batch_size'"),
    ],
)
def test_arguments_that_do_not_fit_the_function_fail_before_any_process_starts(
    args: tuple[object, ...], kwargs: dict[str, object] | None, problem: str
) -> None:
    with pytest.raises(TypeError, match=problem) as info:
        notebook_launcher(train, args, num_processes=2, kwargs=kwargs, cpu=True)
    assert "train(lr, epochs=3) cannot be called" in str(info.value)
    assert "nothing was started" in str(info.value)
    assert psutil.Process().children(recursive=True) == []
    assert info.value.__cause__ is None and info.value.__context__ is None


def test_arguments_that_fit_still_launch() -> None:
    assert notebook_launcher(train, (0.5,), 2, kwargs={"epochs": 2}, cpu=True) == [1.0, 1.0]


def test_a_function_without_a_readable_signature_is_passed_through() -> None:
    assert notebook_launcher(max, (3, 5), 2, cpu=True) == [5, 5]  # max has no signature


def _joined_group() -> dist.ProcessGroup:
    """A new group that both ranks have finished connecting (gloo's ``new_group`` may return
    on one rank while the other still connects: without the barrier, a rank that returns and
    exits first would break its peer's connecting, a different failure)."""
    group = dist.new_group([0, 1])
    dist.barrier(group=group)
    return group


def returns(kind: str) -> object:
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    values = {
        "accelerator": lambda: accelerator,
        "loader": lambda: accelerator.prepare(
            torch.utils.data.DataLoader(list(range(8)), batch_size=2)
        ),
        "optimizer": lambda: accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1)),
        "state": lambda: {"metrics": [1.0], "state": accelerator.state},
        "model": lambda: model,
        "group": lambda: (1.0, [_joined_group()]),
    }
    return values[kind]()


@pytest.mark.parametrize(
    ("kind", "type_name", "advice"),
    [
        ("accelerator", "an Accelerator", "`accelerator.unwrap_model(model)`"),
        ("loader", "a DataLoaderShard", "Return the data"),
        ("optimizer", "an AcceleratedOptimizer", "`optimizer.state_dict()`"),
        ("state", "an AcceleratorState (at result['state'])", "`state.process_index`"),
        ("group", "a ProcessGroup (at result[1][0])", "Return plain data"),
    ],
)
def test_objects_that_only_work_in_their_worker_are_refused_at_return(
    kind: str, type_name: str, advice: str
) -> None:
    with pytest.raises(TypeError) as info:
        notebook_launcher(returns, (kind,), num_processes=2, cpu=True)
    message = str(info.value)
    assert f"the launched function returned {type_name}, which only works inside" in message
    assert advice in message
    assert "Raised on ranks 0, 1 of 2 (identical on each)" in "\n".join(info.value.__notes__)


def test_a_prepared_model_comes_back_as_the_plain_module_on_the_cpu() -> None:
    models = notebook_launcher(returns, ("model",), num_processes=2, cpu=True)
    assert all(type(model) is torch.nn.Linear for model in models)
    assert models[0](torch.ones(1, 2)).shape == (1, 1)
