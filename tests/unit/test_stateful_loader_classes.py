"""Loaders built on torchdata's ``StatefulDataLoader`` in one process: they are instances of it,
their ``state_dict()`` is where the last handed-out batch left them, and torchdata stays
unimported (and its absence is explained) unless the option is used."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from nb_accel.data_loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    SkipDataLoader,
)

pytest.importorskip("torchdata.stateful_dataloader")
from torchdata.stateful_dataloader import StatefulDataLoader

CLASSES = [DataLoaderShard, DataLoaderDispatcher, SkipDataLoader]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )


def _epoch(loader: Any, mark: int = 0) -> tuple[list[list[int]], Any]:
    """Every batch of one epoch, and the loader's state after ``mark`` batches."""
    batches, state = [], None
    for index, batch in enumerate(loader):
        batches.append(batch.tolist())
        if index + 1 == mark:
            state = loader.state_dict()
    return batches, state


def _plain(value: Any) -> Any:
    """``value`` with its tensors as lists, so that states compare with ``==``."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(42)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_state_dict_is_torchdatas_after_the_batches_handed_out(cls: type, workers: int) -> None:
    options = {"batch_size": 4, "num_workers": workers, "shuffle": True}
    reference = StatefulDataLoader(list(range(48)), generator=_generator(), **options)
    loader = cls(list(range(48)), generator=_generator(), use_stateful_dataloader=True, **options)
    assert isinstance(loader, cls) and isinstance(loader, StatefulDataLoader)
    assert loader.use_stateful_dataloader and not cls.use_stateful_dataloader
    expected, reference_state = _epoch(reference, mark=5)
    batches, state = _epoch(loader, mark=5)
    assert batches == expected
    assert _plain(state) == _plain(reference_state)

    resumed = cls(list(range(48)), generator=_generator(), use_stateful_dataloader=True, **options)
    resumed.load_state_dict(state)
    assert _epoch(resumed)[0] == expected[5:]


@pytest.mark.parametrize("cls", [DataLoaderShard, DataLoaderDispatcher], ids=lambda c: c.__name__)
def test_a_state_taken_at_the_last_batch_resumes_with_a_whole_epoch(cls: type) -> None:
    loader = cls(list(range(12)), batch_size=4, use_stateful_dataloader=True)
    states = []
    for index, _ in enumerate(loader):
        assert loader.end_of_dataloader == (index == 2)
        states.append(loader.state_dict())
    resumed = cls(list(range(12)), batch_size=4, use_stateful_dataloader=True)
    resumed.load_state_dict(states[1])
    assert [b.tolist() for b in resumed] == [[8, 9, 10, 11]]
    resumed.load_state_dict(states[2])
    assert [b.tolist() for b in resumed] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_loaders_are_state_mixins_and_their_own_base_dataloader() -> None:
    for stateful in (False, True):
        for cls in CLASSES:
            loader = cls(range(8), batch_size=4, use_stateful_dataloader=stateful)
            assert isinstance(loader, DataLoader)
            assert isinstance(loader, StatefulDataLoader) == stateful
            assert loader.base_dataloader is loader
            if cls is not SkipDataLoader:
                assert isinstance(loader, DataLoaderStateMixin)
    with pytest.raises(AttributeError):
        _ = DataLoaderShard.base_dataloader


def test_skip_data_loader_skips_on_torchdata() -> None:
    loader = SkipDataLoader(
        list(range(16)), batch_size=4, skip_batches=2, use_stateful_dataloader=True
    )
    assert [b.tolist() for b in loader] == [[8, 9, 10, 11], [12, 13, 14, 15]]


def test_torchdata_is_imported_only_when_the_option_is_used() -> None:
    result = _run(
        """
        import sys
        from torch.utils.data import DataLoader
        from nb_accel.data_loader import prepare_data_loader
        from nb_accel.utils import is_torchdata_stateful_dataloader_available
        assert is_torchdata_stateful_dataloader_available()
        list(prepare_data_loader(DataLoader(range(8), batch_size=2)))
        assert "torchdata" not in sys.modules
        plain = DataLoader(range(8), batch_size=2)
        loader = prepare_data_loader(plain, use_stateful_dataloader=True)
        assert "torchdata" in sys.modules and loader.use_stateful_dataloader
        """
    )
    assert result.returncode == 0, result.stderr


def test_without_torchdata_the_option_names_the_extra_to_install() -> None:
    result = _run(
        """
        import sys
        sys.modules["torchdata"] = None  # as if it were not installed
        from torch.utils.data import DataLoader
        from nb_accel import DataLoaderConfiguration
        from nb_accel.data_loader import DataLoaderShard, prepare_data_loader
        from nb_accel.utils import is_torchdata_stateful_dataloader_available
        assert not is_torchdata_stateful_dataloader_available()
        for build in (
            lambda: DataLoaderConfiguration(use_stateful_dataloader=True),
            lambda: prepare_data_loader(DataLoader(range(8)), use_stateful_dataloader=True),
            lambda: DataLoaderShard(range(8), use_stateful_dataloader=True),
        ):
            try:
                build()
            except ImportError as error:
                print(error)
            else:
                raise SystemExit("no ImportError")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("pip install nb_accel[stateful]") == 3
