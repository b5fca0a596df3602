"""``TorchDynamoPlugin``, ``DynamoBackend`` and ``InitProcessGroupKwargs`` as Accelerate spells
them, and compiling in one process."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch

import nb_accel
import nb_accel.utils
from nb_accel import Accelerator, InitProcessGroupKwargs, TorchDynamoPlugin, notebook_launcher
from nb_accel.utils import DynamoBackend, is_compiled_module


@pytest.fixture(autouse=True)
def _compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading inductor sets its cache folder in the environment: the test's folder, for the
    test only."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile_cache"))


def test_names_are_where_accelerate_has_them() -> None:
    from nb_accel.utils.dataclasses import InitProcessGroupKwargs as from_dataclasses
    from nb_accel.utils.other import is_compiled_module as from_other

    assert nb_accel.utils.TorchDynamoPlugin is TorchDynamoPlugin
    assert nb_accel.utils.InitProcessGroupKwargs is from_dataclasses is InitProcessGroupKwargs
    assert from_other is is_compiled_module


def test_plugin_defaults_names_and_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BACKEND", "MODE", "USE_FULLGRAPH", "USE_DYNAMIC"):
        monkeypatch.delenv(f"ACCELERATE_DYNAMO_{name}", raising=False)
    plugin = TorchDynamoPlugin()
    assert plugin.backend is DynamoBackend.NO and not plugin.enabled
    assert (plugin.mode, plugin.fullgraph, plugin.dynamic) == ("default", False, None)
    assert TorchDynamoPlugin(backend="inductor").to_kwargs() == {"backend": "inductor"}
    full = TorchDynamoPlugin(
        backend=DynamoBackend.AOT_EAGER, mode="max-autotune", fullgraph=True, dynamic=True
    )
    assert full.to_kwargs() == {
        "backend": "aot_eager",
        "mode": "max-autotune",
        "fullgraph": True,
        "dynamic": True,
    }
    assert full.to_dict()["backend"] == "aot_eager"
    assert "INDUCTOR" in DynamoBackend and "TURBO" not in DynamoBackend
    assert DynamoBackend.list()[:4] == ["NO", "EAGER", "AOT_EAGER", "INDUCTOR"]
    with pytest.raises(ValueError, match=r"unknown dynamo backend 'turbo'.*'inductor'"):
        TorchDynamoPlugin(backend="turbo")


def test_plugin_reads_accelerates_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "false")
    plugin = TorchDynamoPlugin()
    assert plugin.backend is DynamoBackend.INDUCTOR
    assert (plugin.mode, plugin.fullgraph, plugin.dynamic) == ("reduce-overhead", True, False)
    assert TorchDynamoPlugin(backend="no").backend is DynamoBackend.NO  # an argument wins


def test_backend_and_plugin_together_are_refused() -> None:
    with pytest.raises(ValueError, match="either dynamo_backend or dynamo_plugin"):
        Accelerator(cpu=True, dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin())


def test_one_process_compiles_and_unwraps() -> None:
    # in a launched worker: see test_accelerate_api_fidelity's compile_regions test
    notebook_launcher(_compiles_and_unwraps, num_processes=1)


def _compiles_and_unwraps() -> None:
    accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    original = torch.nn.Linear(3, 2)
    model = accelerator.prepare(original)
    assert is_compiled_module(model) and model._orig_mod is original
    assert accelerator.prepare(model) is model
    x = torch.randn(4, 3)
    torch.testing.assert_close(model(x), original(x))
    assert accelerator.unwrap_model(model) is original
    assert accelerator.unwrap_model(model, keep_torch_compile=True) is model
    assert accelerator.state.dynamo_plugin.backend is DynamoBackend.EAGER


def test_disable_leaves_the_model_as_it_is() -> None:
    plugin = TorchDynamoPlugin(backend="eager", disable=True)
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
    original = torch.nn.Linear(3, 2)
    assert accelerator.unwrap_model(accelerator.prepare(original)) is original


def test_init_process_group_kwargs_defaults_as_in_accelerate() -> None:
    assert InitProcessGroupKwargs().timeout == timedelta(seconds=600)
    assert InitProcessGroupKwargs(backend="gloo").timeout == timedelta(seconds=1800)
    assert InitProcessGroupKwargs().to_kwargs() == {}
    given = InitProcessGroupKwargs(timeout=timedelta(seconds=5))
    assert given.to_kwargs() == {"timeout": timedelta(seconds=5)}
    assert given.chosen_timeout == timedelta(seconds=5)
    assert InitProcessGroupKwargs(backend="gloo").chosen_timeout is None


def test_init_process_group_kwargs_in_one_process_change_nothing() -> None:
    handler = InitProcessGroupKwargs(backend="mpi", timeout=timedelta(seconds=5))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    assert accelerator.num_processes == 1
