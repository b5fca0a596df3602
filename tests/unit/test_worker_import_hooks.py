"""A worker adapts a library when it is loaded, never importing it itself: the import hooks, the
Trainer's logs as charted, and what an XLA launch's workers set for Accelerate."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import pytest

from nb_accel.launch.plan import LaunchPlan
from nb_accel.launch.xla.settings import xla_worker_settings
from nb_accel.worker.process import import_hooks, trainer_support
from nb_accel.worker.process.import_hooks import waiting_hooks, when_imported
from nb_accel.worker.process.trainer_support import charted_logs, set_up_training_arguments


def _package(folder: Path, name: str, body: str) -> None:
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text("")
    (folder / name / "trainer.py").write_text(body)


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path``; modules imported from it and waiting hooks are forgotten."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]
    import_hooks._hooks.clear()
    if import_hooks._FINDER in sys.meta_path:
        sys.meta_path.remove(import_hooks._FINDER)


def test_a_hook_runs_right_after_the_import_that_loads_the_module(fresh: Path) -> None:
    _package(fresh, "library_a", "CALLBACKS = ['default']\n")
    seen: list[list[str]] = []
    when_imported("library_a.trainer", lambda module: module.CALLBACKS.append("ours"))
    when_imported("library_a.trainer", lambda module: seen.append(list(module.CALLBACKS)))
    assert "library_a.trainer" not in sys.modules  # nothing imported it
    assert waiting_hooks() == {"library_a.trainer": 2}
    import library_a.trainer as loaded  # type: ignore[import-not-found]

    assert loaded.CALLBACKS == ["default", "ours"] and seen == [["default", "ours"]]
    # the module keeps its own loader, and nothing waits any more
    assert type(loaded.__loader__).__name__ == "SourceFileLoader"
    assert loaded.__spec__.loader is loaded.__loader__
    assert waiting_hooks() == {}
    assert import_hooks._FINDER not in sys.meta_path


def test_a_module_already_loaded_is_adapted_at_once(fresh: Path) -> None:
    _package(fresh, "library_b", "CALLBACKS = ['default']\n")
    import library_b.trainer as loaded  # type: ignore[import-not-found]

    when_imported("library_b.trainer", lambda module: module.CALLBACKS.append("ours"))
    assert loaded.CALLBACKS == ["default", "ours"]
    assert waiting_hooks() == {} and import_hooks._FINDER not in sys.meta_path


def test_a_failing_hook_is_a_warning_and_the_import_succeeds(fresh: Path) -> None:
    _package(fresh, "library_c", "VALUE = 1\n")

    def broken(module: object) -> None:
        raise KeyError("DEFAULT_CALLBACKS")

    when_imported("library_c.trainer", broken)
    with pytest.warns(RuntimeWarning, match=r"could not adapt library_c\.trainer"):
        import library_c.trainer as loaded  # type: ignore[import-not-found]
    assert loaded.VALUE == 1


def test_a_failed_import_leaves_the_hook_waiting_for_the_next(fresh: Path) -> None:
    _package(fresh, "library_d", "raise ImportError('not yet')\n")
    when_imported("library_d.trainer", lambda module: setattr(module, "ADAPTED", True))
    with pytest.raises(ImportError, match="not yet"):
        import library_d.trainer  # type: ignore[import-not-found]  # noqa: F401
    assert waiting_hooks() == {"library_d.trainer": 1}
    (fresh / "library_d" / "trainer.py").write_text("VALUE = 2\n")
    import library_d.trainer as loaded

    assert loaded.ADAPTED is True and waiting_hooks() == {}


def test_the_chart_gets_the_trainer_s_metrics_not_its_speed_summary() -> None:
    logs = {
        "loss": 1.5,
        "grad_norm": 0.3,
        "learning_rate": 5e-05,
        "epoch": 0.5,
        "eval_loss": 1.4,
        "eval_runtime": 0.1,
        "eval_samples_per_second": 80.0,
        "train_runtime": 2.0,
        "train_steps_per_second": 4.0,
        "train_loss": 1.45,
        "total_flos": 1e9,
    }
    assert charted_logs(logs) == {
        "loss": 1.5,
        "grad_norm": 0.3,
        "learning_rate": 5e-05,
        "eval_loss": 1.4,
        "train_loss": 1.45,
    }


def test_xla_workers_tell_accelerate_to_use_the_xla_devices_without_fsdp() -> None:
    plan = LaunchPlan(8, "xla", "xla", "fork", "bf16", 60.0, gradient_accumulation_steps=4)
    settings = xla_worker_settings(plan)
    assert settings == {
        "NB_ACCEL_MIXED_PRECISION": "bf16",
        "NB_ACCEL_GRADIENT_ACCUMULATION_STEPS": "4",
        "ACCELERATE_USE_CPU": "false",
        "ACCELERATE_MIXED_PRECISION": "bf16",
        "ACCELERATE_USE_FSDP": "false",
    }


class Arguments:
    """Stands for ``TrainingArguments``: devices set up on first read, for this process."""

    setups = 0

    def __init__(self, processes: int, rank: int) -> None:
        self.bf16 = False
        self.mixed_precision = "no"
        self.distributed_state = SimpleNamespace(num_processes=processes, process_index=rank)
        self._n_gpu = 0
        self.__dict__["_setup_devices"] = "cpu"

    @cached_property
    def _setup_devices(self) -> str:
        Arguments.setups += 1
        self.distributed_state = SimpleNamespace(num_processes=2, process_index=1)
        self._n_gpu = 0
        return "cpu:0"


def test_training_arguments_set_up_elsewhere_are_set_up_again_in_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trainer_support, "_waiting", [])
    trainer_support._adapt_training_args(SimpleNamespace(TrainingArguments=Arguments))  # type: ignore[arg-type]
    try:
        from_the_kernel = pickle.dumps(Arguments(processes=1, rank=0))
        from_this_rank = pickle.dumps(Arguments(processes=2, rank=1))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
        stale = pickle.loads(from_the_kernel)
        kept = pickle.loads(from_this_rank)
        assert "distributed_state" not in vars(stale) and stale.mixed_precision == "bf16"
        assert kept._setup_devices == "cpu" and kept.mixed_precision == "no"  # a copy of ours
        assert Arguments.setups == 0  # no process group yet: set up once there is one
        set_up_training_arguments()
        assert Arguments.setups == 1
        assert stale._setup_devices == "cpu:0" and stale.distributed_state.num_processes == 2
        assert trainer_support._waiting == []
    finally:
        del Arguments.__setstate__  # type: ignore[attr-defined]
