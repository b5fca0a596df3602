"""Every public class refuses a keyword it has no parameter for: a ``TypeError`` naming it, as
Python gives for a plain function. The classes that take ``**kwargs`` (to hand options on, as
Accelerate's own do) check what arrives there and name the parameter a misspelling most likely
meant, as ``Accelerator`` does; Accelerate's own keyword names stay accepted. (The trackers of
``nb_accel.tracking`` hand their keywords to their library, which checks them when the run
starts.)"""

from __future__ import annotations

import enum
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import nb_accel
from nb_accel.errors import WorkerFailure

pytestmark = pytest.mark.timeout(60)

#: The modules whose ``__all__`` holds the public classes (the kwargs handlers and
#: configuration dataclasses among them).
MODULES = ("nb_accel", "nb_accel.utils", "nb_accel.data_loader", "nb_accel.state")
#: Classes of the engines nb_accel does not run: making one is refused, whatever it is given.
REFUSED_WHEN_MADE = {"DeepSpeedPlugin", "MegatronLMPlugin", "TorchTensorParallelPlugin"}
REFUSED_WHEN_MADE |= {"FP8RecipeKwargs"}


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)


def _scheduler_arguments() -> tuple[Any, ...]:
    optimizer = _optimizer()
    return torch.optim.lr_scheduler.StepLR(optimizer, 1), [optimizer]


#: The positional arguments of the classes that need some.
REQUIRED: dict[str, Callable[[], tuple[Any, ...]]] = {
    "AcceleratedOptimizer": lambda: (_optimizer(),),
    "AcceleratedScheduler": _scheduler_arguments,
    "BatchSamplerShard": lambda: (torch.utils.data.BatchSampler(range(4), 2, False),),
    "SkipBatchSampler": lambda: (torch.utils.data.BatchSampler(range(4), 2, False),),
    "DataLoaderDispatcher": lambda: (list(range(4)),),
    "DataLoaderShard": lambda: (list(range(4)),),
    "SkipDataLoader": lambda: (list(range(4)),),
    "IterableDatasetShard": lambda: (list(range(4)),),
    "SeedableRandomSampler": lambda: (list(range(4)),),
    "WorkerFailure": lambda: (0, "ValueError", "message", "traceback"),
}
#: For each class that takes ``**kwargs``: a misspelled keyword, and the parameter it means.
MISSPELLED = {
    "Accelerator": ("mixed_precison", "mixed_precision"),
    "AcceleratorState": ("mixed_precison", "mixed_precision"),
    "PartialState": ("init_metod", "init_method"),
    "DataLoaderShard": ("batch_sise", "batch_size"),
    "DataLoaderDispatcher": ("shufle", "shuffle"),
    "SkipDataLoader": ("bach_size", "batch_size"),
    "ConfigWidget": ("layot", "layout"),
    "tqdm": ("dessc", "desc"),
}


def _public_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for path in MODULES:
        module = importlib.import_module(path)
        for name in module.__all__:
            kind = getattr(module, name)
            if not isinstance(kind, type) or issubclass(kind, (enum.Enum, BaseException)):
                continue
            if kind not in found.values():
                found[name] = kind
    return found


def _takes_more(kind: type) -> bool:
    parameters = inspect.signature(kind).parameters.values()
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


@pytest.fixture(autouse=True)
def _compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.optim loads inductor, which sets its cache folder in the environment: the test's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile_cache"))


def _make(name: str, kind: type, tmp_path: Path, **keywords: Any) -> Any:
    if name == "ConfigWidget":  # a form of its own file, never the user's
        keywords["path"] = tmp_path / "config.toml"
    arguments = REQUIRED.get(name, tuple)()
    return kind(*arguments, **keywords)


@pytest.mark.parametrize("name", sorted(_public_classes()))
def test_an_unknown_keyword_is_refused_naming_it(name: str, tmp_path: Path) -> None:
    kind = _public_classes()[name]
    if name in REFUSED_WHEN_MADE:
        with pytest.raises(NotImplementedError, match="is not supported by nb_accel"):
            _make(name, kind, tmp_path, totally_bogus=1)
        return
    with pytest.raises(TypeError) as caught:
        _make(name, kind, tmp_path, totally_bogus=1)
    message = str(caught.value)
    assert "'totally_bogus'" in message or "takes no arguments" in message, message


@pytest.mark.parametrize("name", sorted(MISSPELLED))
def test_a_misspelled_keyword_names_the_parameter_meant(name: str, tmp_path: Path) -> None:
    kind = _public_classes()[name]
    wrong, meant = MISSPELLED[name]
    with pytest.raises(TypeError, match=rf"'{wrong}' \(did you mean '{meant}'\?\)"):
        _make(name, kind, tmp_path, **{wrong: 1})


def test_every_class_that_takes_more_keywords_checks_them() -> None:
    """A public class that takes ``**kwargs`` has its misspelling above (or makes nothing)."""
    taking = {name for name, kind in _public_classes().items() if _takes_more(kind)}
    assert taking - REFUSED_WHEN_MADE == set(MISSPELLED)


def test_accelerates_own_keywords_stay_accepted() -> None:
    """Accelerate's keywords, named or handed to the process group, are taken without a word
    (those nb_accel has no use for are ignored, as before)."""
    state = nb_accel.AcceleratorState(
        cpu=True, _from_accelerator=True, dynamo_plugin=None, parallelism_config=None, rank=0
    )
    assert state.num_processes == 1
    assert nb_accel.PartialState(cpu=True, timeout=None, group_name="", device_id=None)
    for name in ("deepspeed_plugin", "torch_tp_plugin", "megatron_lm_plugin"):
        with pytest.raises(NotImplementedError, match=f"{name} is not supported by nb_accel"):
            nb_accel.AcceleratorState(cpu=True, **{name: object()})
    failure = WorkerFailure(0, "ValueError", "message", "traceback")
    assert failure.rank == 0


def test_a_loader_takes_accelerates_iteration_and_device_mesh() -> None:
    """``iteration`` is the epoch the first iteration runs as (the sampler is told it) and
    counts up, as in Accelerate; a device mesh without tensor parallelism changes nothing."""
    from nb_accel.data_loader import DataLoaderDispatcher, DataLoaderShard

    epochs: list[int] = []

    class Sampler(torch.utils.data.Sampler[int]):
        def __iter__(self) -> Any:
            return iter(range(4))

        def __len__(self) -> int:
            return 4

        def set_epoch(self, epoch: int) -> None:
            epochs.append(epoch)

    for kind in (DataLoaderShard, DataLoaderDispatcher):
        epochs.clear()
        loader = kind(list(range(4)), sampler=Sampler(), batch_size=2, iteration=3)
        assert loader.iteration == 3
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
        assert loader.iteration == 4 and epochs == [3]
        list(loader)
        assert epochs == [3, 4]

    class Mesh:
        mesh_dim_names = ("dp_shard",)

    assert DataLoaderShard(list(range(2)), torch_device_mesh=Mesh()).iteration == 0
    assert DataLoaderDispatcher(list(range(2)), torch_device_mesh=Mesh()).torch_device_mesh
    Mesh.mesh_dim_names = ("dp", "tp")
    with pytest.raises(NotImplementedError, match="tensor parallelism is not supported"):
        DataLoaderDispatcher(list(range(2)), torch_device_mesh=Mesh())
