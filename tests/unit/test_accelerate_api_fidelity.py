"""Accelerate's documented behaviour where user code notices it: what the constructors accept
and refuse, what the helpers return, the exceptions user code catches."""

from __future__ import annotations

import inspect
import logging
import math
import os
import warnings
from pathlib import Path

import pytest
import torch

from nb_accel import Accelerator, notebook_launcher
from nb_accel.utils import extract_model_from_parallel

pytestmark = pytest.mark.timeout(60)

#: Every parameter of Accelerate 1.15's ``Accelerator.__init__``, and those of the 1.x
#: releases before it that it dropped (``dispatch_batches``, ``even_batches``,
#: ``use_seedable_sampler``, now in ``DataLoaderConfiguration``).
ACCELERATE_PARAMETERS = (
    "device_placement",
    "split_batches",
    "mixed_precision",
    "gradient_accumulation_steps",
    "cpu",
    "dataloader_config",
    "deepspeed_plugin",
    "fsdp_plugin",
    "torch_tp_plugin",
    "megatron_lm_plugin",
    "rng_types",
    "log_with",
    "project_dir",
    "project_config",
    "gradient_accumulation_plugin",
    "step_scheduler_with_optimizer",
    "kwargs_handlers",
    "dynamo_backend",
    "dynamo_plugin",
    "deepspeed_plugins",
    "parallelism_config",
    "dispatch_batches",
    "even_batches",
    "use_seedable_sampler",
)
#: The engines nb_accel does not run: named parameters, refused when given.
ENGINES = ("deepspeed_plugin", "deepspeed_plugins", "megatron_lm_plugin", "torch_tp_plugin")


def test_a_misspelled_keyword_is_a_type_error_that_names_the_parameter_meant() -> None:
    with pytest.raises(TypeError, match=r"'mixed_precison' \(did you mean 'mixed_precision'\?\)"):
        Accelerator(mixed_precison="bf16")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'foo'; its parameters"):
        Accelerator(foo=1)
    with pytest.raises(TypeError, match=r"arguments 'cpus' \(did you mean 'cpu'\?\), 'foo'"):
        Accelerator(foo=1, cpus=True)


def test_every_parameter_accelerate_documents_is_accepted_by_name() -> None:
    parameters = inspect.signature(Accelerator).parameters
    missing = [name for name in ACCELERATE_PARAMETERS if name not in parameters]
    assert missing == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of them is "ignored with a warning" any more
        Accelerator(cpu=True, **dict.fromkeys(ENGINES))


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_nb_accel_does_not_run_is_refused_when_given(engine: str) -> None:
    with pytest.raises(NotImplementedError, match=f"{engine} is not supported by nb_accel"):
        Accelerator(cpu=True, **{engine: object()})


def test_data_parallel_is_unwrapped_however_it_is_nested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # loading inductor sets its cache folder in the environment: the test's, for the test only
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile_cache"))
    inner = torch.nn.Linear(2, 2)
    accelerator = Accelerator(cpu=True)
    for wrapped in (
        torch.nn.DataParallel(inner),
        torch.nn.DataParallel(torch.nn.DataParallel(inner)),
        torch.compile(torch.nn.DataParallel(inner)),
        torch.nn.DataParallel(torch.compile(inner)),
    ):
        assert accelerator.unwrap_model(wrapped) is inner
        assert extract_model_from_parallel(wrapped) is inner
    kept = extract_model_from_parallel(
        torch.compile(torch.nn.DataParallel(inner)), keep_torch_compile=True
    )
    assert kept._orig_mod is inner  # the compile wrapper kept, the container gone


def test_extract_model_from_parallel_recursive_unwraps_submodules_in_place() -> None:
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(
        torch.nn.DataParallel(first), torch.nn.Sequential(torch.nn.DataParallel(second))
    )
    assert extract_model_from_parallel(model) is model
    assert isinstance(model[0], torch.nn.DataParallel)  # not recursive: left as it was
    assert extract_model_from_parallel(model, recursive=True) is model
    assert model[0] is first and model[1][0] is second


class _OnlySaves:
    def state_dict(self) -> dict[str, int]:
        return {}


def test_register_for_checkpointing_refuses_with_a_value_error_naming_each_item() -> None:
    accelerator = Accelerator(cpu=True)
    counter = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError) as info:
        accelerator.register_for_checkpointing(counter, 3, _OnlySaves())
    message = str(info.value)
    assert "Item at index 1, int, has neither state_dict() nor load_state_dict()" in message
    assert "Item at index 2, _OnlySaves, has no load_state_dict()" in message
    assert "index 0" not in message
    assert accelerator._custom_objects == []  # none registered when one is refused
    accelerator.register_for_checkpointing(counter)
    assert accelerator._custom_objects == [counter]


def test_concatenate_one_batch_of_anything_is_that_batch() -> None:
    from nb_accel.utils import concatenate

    for single in (5, "a", [1, 2], {"a": 3}, None, ("x", [None])):
        assert concatenate([single]) == single
    pair = concatenate([(torch.ones(1), 3)])
    assert isinstance(pair, tuple) and pair[1] == 3 and pair[0].tolist() == [1.0]


def test_concatenate_joins_tensors_through_lists_tuples_and_mappings() -> None:
    from collections import OrderedDict

    from nb_accel.utils import concatenate

    joined = concatenate(
        [
            OrderedDict(x=torch.zeros(1, 2), y=(torch.zeros(1), [torch.zeros(2)])),
            OrderedDict(x=torch.ones(2, 2), y=(torch.ones(1), [torch.ones(1)])),
        ]
    )
    assert isinstance(joined, OrderedDict) and isinstance(joined["y"], tuple)
    assert joined["x"].shape == (3, 2)
    assert joined["y"][0].tolist() == [0.0, 1.0] and joined["y"][1][0].tolist() == [0, 0, 1]
    assert concatenate([torch.zeros(2, 1), torch.ones(2, 1)], dim=1).shape == (2, 2)
    with pytest.raises(TypeError, match="not 2 values of type int"):
        concatenate([5, 6])
    with pytest.raises(IndexError, match="at least one batch"):
        concatenate([])


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(4, 3)
        self.head = torch.nn.Linear(3, 4, bias=False)
        self.head.weight = self.embed.weight


def test_unwrapping_without_the_fp32_wrapper_gives_back_the_original_forward() -> None:
    import pickle

    from nb_accel.utils import convert_outputs_to_fp32, extract_model_from_parallel

    model = torch.nn.Linear(2, 2)
    model._original_forward = model.forward  # as Accelerate's code and tests do
    model.forward = convert_outputs_to_fp32(model.forward)  # type: ignore[method-assign]
    plain = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in vars(plain) and "_original_forward" not in vars(plain)
    pickle.dumps(plain)  # nothing of the wrapper left


def test_save_with_safetensors_stores_tied_weights_once_and_names_the_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from safetensors.torch import load_file

    from nb_accel.utils import load_checkpoint_in_model, save

    model = _Tied()
    path = tmp_path / "tied.safetensors"
    with caplog.at_level(logging.WARNING):  # a logging record, as Accelerate's
        save(model.state_dict(), path, safe_serialization=True)
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "Removed shared tensor(s) 'head.weight' (same memory as 'embed.weight') while saving"
    )
    stored = load_file(path)
    assert list(stored) == ["embed.weight"]
    assert torch.equal(stored["embed.weight"], model.embed.weight)
    fresh = _Tied()
    fresh.head.weight = torch.nn.Parameter(torch.zeros(4, 3))  # untied, to see both loaded
    load_checkpoint_in_model(fresh, str(path))
    assert torch.equal(fresh.head.weight, model.embed.weight)
    assert torch.equal(fresh.embed.weight, model.embed.weight)


def test_save_with_safetensors_keeps_distinct_views_of_one_memory(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from nb_accel.utils import save

    whole = torch.arange(6.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out: no warning
        save(
            {"low": whole[:3], "high": whole[3:]},
            tmp_path / "v.safetensors",
            safe_serialization=True,
        )
    stored = load_file(tmp_path / "v.safetensors")
    assert stored["low"].tolist() == [0.0, 1.0, 2.0] and stored["high"].tolist() == [3.0, 4.0, 5.0]
    with pytest.raises(TypeError, match="saves a dict of tensors, not a list"):
        save([whole], tmp_path / "list.safetensors", safe_serialization=True)


def test_reset_state_takes_accelerates_arguments() -> None:
    from nb_accel.state import AcceleratorState, GradientState, PartialState

    def built() -> tuple[bool, bool]:
        return bool(AcceleratorState._shared_state), bool(PartialState._shared_state)

    Accelerator(cpu=True)
    AcceleratorState._reset_state()
    assert built() == (False, True)
    Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    assert built() == (False, False)
    Accelerator(cpu=True)
    assert GradientState._shared_state
    GradientState._reset_state()
    PartialState._reset_state()
    assert not GradientState._shared_state and built() == (True, False)


def test_kwargs_handler_is_the_base_of_the_handlers() -> None:
    from dataclasses import dataclass
    from datetime import timedelta

    from nb_accel.utils import (
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        KwargsHandler,
        ProfileKwargs,
        TorchDynamoPlugin,
    )

    for kind in (
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProfileKwargs,
        TorchDynamoPlugin,
    ):
        assert issubclass(kind, KwargsHandler), kind

    @dataclass
    class Mine(KwargsHandler):
        size: int = 1
        name: str = "a"

    assert Mine(size=3).to_kwargs() == {"size": 3}
    assert Mine().to_dict() == {"size": 1, "name": "a"}
    assert GradScalerKwargs(backoff_factor=0.25).to_kwargs() == {"backoff_factor": 0.25}
    assert InitProcessGroupKwargs(timeout=timedelta(seconds=5)).to_kwargs() == {
        "timeout": timedelta(seconds=5)
    }
    assert "_timeout_given" not in InitProcessGroupKwargs().to_dict()


def test_kwargs_handlers_take_one_of_each_kind_the_accelerator_uses() -> None:
    from nb_accel.utils import GradScalerKwargs, KwargsHandler

    with pytest.raises(ValueError, match="two GradScalerKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()])
    with pytest.raises(TypeError, match="KwargsHandler is not a handler the Accelerator uses"):
        Accelerator(cpu=True, kwargs_handlers=[KwargsHandler()])


def test_convert_to_fp32_and_listify_keep_the_structure() -> None:
    from nb_accel.utils import convert_outputs_to_fp32, convert_to_fp32, listify

    half = {"a": torch.ones(2, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)]}
    kept = (torch.ones(1, dtype=torch.int64), torch.ones(1, dtype=torch.float64), "label")
    converted = convert_to_fp32({**half, "kept": kept})
    assert converted["a"].dtype == converted["b"][0].dtype == torch.float32
    assert converted["kept"][0].dtype == torch.int64 and converted["kept"][1].dtype == torch.float64
    assert converted["kept"][2] == "label"

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's forward."""
        return x.half(), x.long()

    wrapped = convert_outputs_to_fp32(forward)
    floats, ints = wrapped(torch.ones(2))
    assert floats.dtype == torch.float32 and ints.dtype == torch.int64
    assert wrapped.__doc__ == "The model's forward."

    assert listify({"a": torch.tensor([1, 2]), "b": (torch.tensor(3.5), "s")}) == {
        "a": [1, 2],
        "b": (3.5, "s"),
    }
    assert listify([torch.ones(1, 2, dtype=torch.bfloat16)]) == [[[1.0, 1.0]]]
    assert listify(5) == 5


def test_purge_accelerate_environment_puts_the_variables_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import unittest

    from nb_accel.utils import purge_accelerate_environment

    monkeypatch.setenv("ACCELERATE_KEPT", "before")
    monkeypatch.delenv("ACCELERATE_NEW", raising=False)

    @purge_accelerate_environment
    def sets_them() -> str:
        os.environ["ACCELERATE_NEW"] = "fp16"
        os.environ["ACCELERATE_KEPT"] = "changed"
        return "done"

    assert sets_them() == "done"
    assert os.environ["ACCELERATE_KEPT"] == "before" and "ACCELERATE_NEW" not in os.environ

    @purge_accelerate_environment
    class Base(unittest.TestCase):
        def test_removes(self) -> None:
            del os.environ["ACCELERATE_KEPT"]

    class Child(Base):
        def test_sets(self) -> None:
            os.environ["ACCELERATE_NEW"] = "bf16"
            raise RuntimeError("the variables come back on the way out of an exception too")

    Base("test_removes").test_removes()
    with pytest.raises(RuntimeError):
        Child("test_sets").test_sets()
    assert os.environ["ACCELERATE_KEPT"] == "before" and "ACCELERATE_NEW" not in os.environ


def test_is_torch_version_compares_the_installed_torch() -> None:
    from nb_accel.utils import is_torch_version

    assert is_torch_version(">=", "2.0") and not is_torch_version("<", "2.0")
    assert is_torch_version("!=", "1.0") and is_torch_version("<", "99")
    with pytest.raises(ValueError, match="unknown operation '=>'"):
        is_torch_version("=>", "2.0")


class _Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _compile_regions_checked(cache_dir: str) -> None:
    """The checks, in a launched worker: compiling in the test process would start autograd's
    device threads there at its next backward pass (on a CUDA build of torch), which the
    forked workers of the tests after it could not run one with."""
    from nb_accel.utils import compile_regions, has_compiled_regions, is_compiled_module

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    model = _Blocks()
    regional = compile_regions(model, backend="eager")
    assert regional is not model and type(regional) is _Blocks
    assert all(is_compiled_module(layer) for layer in regional.layers)
    assert is_compiled_module(regional.head)
    assert not any(is_compiled_module(layer) for layer in model.layers)  # left as it was
    assert regional.layers[0]._orig_mod is model.layers[0]  # the same parameters
    assert has_compiled_regions(regional) and not has_compiled_regions(model)
    x = torch.ones(4, 2)
    assert torch.equal(regional(x), model(x))
    assert extract_model_from_parallel(regional) is model
    assert extract_model_from_parallel(regional, keep_torch_compile=True) is regional
    assert Accelerator(cpu=True).unwrap_model(regional) is model
    plain = torch.nn.Linear(2, 2)
    assert is_compiled_module(compile_regions(plain))  # nothing repeated: compiled whole


def test_compile_regions_compiles_each_repeated_block_and_unwraps_to_the_original(
    tmp_path: Path,
) -> None:
    cache_dir = str(tmp_path / "compile_cache")
    notebook_launcher(_compile_regions_checked, args=(cache_dir,), num_processes=1)


def test_parallelism_config_takes_accelerates_sizes_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nb_accel import ParallelismConfig

    config = ParallelismConfig()
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size) == (
        1,
        1,
        1,
        1,
    )
    assert config.total_size == 1 and config.active_mesh_dims == []
    sharded = ParallelismConfig(dp_shard_size=4)
    assert sharded.dp_shard_enabled and not sharded.dp_replicate_enabled
    assert sharded.total_size == sharded.data_parallel_size == 4
    assert sharded.active_mesh_dims == sharded.dp_dim_names == ["dp_shard"]
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "3")
    assert ParallelismConfig().dp_replicate_size == 3
    with pytest.raises(ValueError, match="dp_shard_size must be at least 1, not 0"):
        ParallelismConfig(dp_shard_size=0)


@pytest.mark.parametrize(
    ("sizes", "names", "shape"),
    [
        ({"dp_replicate_size": 8}, ("dp_replicate",), (8,)),
        ({"dp_shard_size": 8}, ("dp_shard",), (8,)),
        ({"dp_replicate_size": 2, "dp_shard_size": 4}, ("dp_replicate", "dp_shard"), (2, 4)),
        ({"dp_shard_size": 4, "tp_size": 2}, ("dp_shard", "tp"), (4, 2)),
        ({"dp_shard_size": 2, "cp_size": 2, "tp_size": 2}, ("dp_shard", "cp", "tp"), (2, 2, 2)),
    ],
)
def test_a_parallelism_config_lays_out_accelerates_mesh(
    sizes: dict[str, int], names: tuple[str, ...], shape: tuple[int, ...]
) -> None:
    from nb_accel.parallelism_config import ParallelismConfig

    config = ParallelismConfig(**sizes)
    assert config._get_mesh() == (names, shape)
    assert config.total_size == math.prod(shape)
    assert config.fsdp_dim_names[-1] == "dp_shard_cp"
    if "tp" in names:
        assert config.tp_handler is not None and config.non_dp_dim_names[0] == "tp"


def test_a_parallelism_config_refuses_what_cannot_compose() -> None:
    from nb_accel.parallelism_config import ParallelismConfig

    with pytest.raises(ValueError, match="composes with FSDP2, not with replicas alone"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    with pytest.raises(ValueError, match="context and sequence parallelism split the same"):
        ParallelismConfig(cp_size=2, sp_size=2)
    with pytest.raises(ValueError, match="cp_backend must be 'torch'"):
        ParallelismConfig(cp_backend="ring")
    with pytest.raises(ValueError, match="PARALLELISM_CONFIG_TP_SIZE='two' is not a whole"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
            ParallelismConfig()


@pytest.mark.parametrize(
    ("sizes", "device", "sharded", "refused", "kind"),
    [
        ({"tp_size": 2}, "cpu", True, "no dimension is left for FSDP", ValueError),
        ({"sp_size": 2}, "cpu", False, "sequence parallelism is DeepSpeed's", NotImplementedError),
        ({"cp_size": 2}, "cpu", False, "context parallelism runs on CUDA GPUs only", ValueError),
    ],
)
def test_what_nb_accel_does_not_run_is_refused_before_training(
    sizes: dict[str, int], device: str, sharded: bool, refused: str, kind: type[Exception]
) -> None:
    from nb_accel.parallelism_config import ParallelismConfig
    from nb_accel.runtime.device_types import device_type
    from nb_accel.runtime.parallelism import fit_to_run

    config = ParallelismConfig(**sizes)  # describing the layout is fine
    with pytest.raises(kind, match=refused):
        fit_to_run(config, 2, sharded=sharded, device_type=device_type(device))


def test_tensor_parallelism_alone_fits_a_run() -> None:
    from nb_accel.parallelism_config import ParallelismConfig
    from nb_accel.runtime.device_types import device_type
    from nb_accel.runtime.parallelism import fit_to_run

    cpu, gpus = device_type("cpu"), device_type("cuda")
    config = ParallelismConfig(tp_size=2, dp_shard_size=2)
    fit_to_run(config, 4, sharded=True, device_type=cpu)
    fit_to_run(ParallelismConfig(tp_size=2), 2, sharded=False, device_type=cpu)
    fit_to_run(ParallelismConfig(cp_size=2, dp_shard_size=2), 4, sharded=True, device_type=gpus)
    assert config.total_size == 4


def test_context_parallel_options_take_accelerates_strategies() -> None:
    from nb_accel.parallelism_config import ParallelismConfig, TorchContextParallelConfig
    from nb_accel.utils import TorchContextParallelConfig as from_utils
    from nb_accel.utils import TorchTensorParallelConfig

    assert from_utils is TorchContextParallelConfig
    assert TorchContextParallelConfig().cp_comm_strategy == "allgather"
    assert TorchTensorParallelConfig().enable_async_tp is False
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    chosen = ParallelismConfig(cp_size=2, cp_handler=TorchContextParallelConfig("alltoall"))
    assert chosen.cp_handler is not None and chosen.cp_handler.cp_comm_strategy == "alltoall"
    with pytest.warns(UserWarning, match="cp_handler is ignored"):
        ParallelismConfig(cp_handler=TorchContextParallelConfig())


def test_the_accelerator_checks_a_parallelism_config_against_its_processes() -> None:
    from nb_accel import ParallelismConfig

    plain = Accelerator(cpu=True)
    assert plain.parallelism_config is None
    with pytest.raises(RuntimeError, match="Data parallelism is not configured"):
        _ = plain.data_parallel_rank
    config = ParallelismConfig()
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    assert accelerator.parallelism_config is config and config.total_size == 1
    assert accelerator.data_parallel_rank == accelerator.data_parallel_shard_rank == 0
    assert accelerator.tensor_parallel_rank == accelerator.context_parallel_rank == 0
    assert accelerator.torch_device_mesh is None  # one process: no mesh
    with pytest.raises(ValueError, match=r"spans 2 processes .* but this run has 1"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_replicate_size=2))


def test_the_file_name_constants_are_accelerates_and_save_state_uses_them() -> None:
    from nb_accel.utils import constants

    assert (
        constants.MODEL_NAME,
        constants.OPTIMIZER_NAME,
        constants.RNG_STATE_NAME,
        constants.SCALER_NAME,
        constants.SCHEDULER_NAME,
    ) == ("pytorch_model", "optimizer", "random_states", "scaler.pt", "scheduler")
    assert (constants.WEIGHTS_NAME, constants.SAFE_WEIGHTS_NAME) == (
        "pytorch_model.bin",
        "model.safetensors",
    )
    assert (constants.WEIGHTS_INDEX_NAME, constants.SAFE_WEIGHTS_INDEX_NAME) == (
        "pytorch_model.bin.index.json",
        "model.safetensors.index.json",
    )


def test_save_state_writes_the_files_the_constants_name(tmp_path: Path) -> None:
    from nb_accel.utils import OPTIMIZER_NAME, RNG_STATE_NAME, SAFE_WEIGHTS_NAME, SCHEDULER_NAME

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    accelerator.prepare(model, optimizer, scheduler)
    folder = Path(accelerator.save_state(tmp_path / "checkpoint"))
    names = {path.name for path in folder.iterdir()}
    assert {SAFE_WEIGHTS_NAME, f"{OPTIMIZER_NAME}.bin", f"{SCHEDULER_NAME}.bin"} <= names
    assert f"{RNG_STATE_NAME}_0.pkl" in names


def test_grad_scaler_and_mixed_precision_context_helpers() -> None:
    from nb_accel.utils import get_grad_scaler, get_mixed_precision_context_manager

    scaler = get_grad_scaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "cpu"
    assert scaler.get_scale() == 8.0
    Accelerator(cpu=True, mixed_precision="bf16")
    layer = torch.nn.Linear(2, 2)
    with get_mixed_precision_context_manager(native_amp=True):
        assert layer(torch.ones(1, 2)).dtype == torch.bfloat16
    with get_mixed_precision_context_manager(native_amp=False):
        assert layer(torch.ones(1, 2)).dtype == torch.float32


def test_load_reads_numpy_arrays_with_weights_only(tmp_path: Path) -> None:
    import numpy as np

    from nb_accel.utils import load

    path = tmp_path / "state.bin"
    torch.save({"array": np.arange(3, dtype=np.int64), "tensor": torch.ones(2)}, path)
    loaded = load(path, map_location="cpu", weights_only=True)
    assert loaded["array"].tolist() == [0, 1, 2] and loaded["tensor"].tolist() == [1.0, 1.0]


def test_fsdp_ram_efficient_loading_switches_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from nb_accel.utils import (
        FullyShardedDataParallelPlugin,
        disable_fsdp_ram_efficient_loading,
        enable_fsdp_ram_efficient_loading,
    )

    for name in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        monkeypatch.setenv(name, "")  # so that monkeypatch puts back what was there
        monkeypatch.delenv(name)
    enable_fsdp_ram_efficient_loading()
    assert os.environ["ACCELERATE_USE_FSDP"] == "True"
    assert FullyShardedDataParallelPlugin().cpu_ram_efficient_loading is True
    disable_fsdp_ram_efficient_loading()
    assert FullyShardedDataParallelPlugin().cpu_ram_efficient_loading is False


def test_get_module_children_bottom_up_lists_children_before_their_parents() -> None:
    from nb_accel.utils import get_module_children_bottom_up

    shared = torch.nn.ReLU()
    inner = torch.nn.Sequential(torch.nn.Linear(1, 1), shared)
    model = torch.nn.Sequential(inner, shared, torch.nn.Linear(1, 1))
    named = get_module_children_bottom_up(model, return_fqns=True)
    assert [name for name, _ in named] == ["0.0", "0.1", "0", "2", ""]
    assert get_module_children_bottom_up(model) == [module for _, module in named]
    assert named[-1][1] is model


def test_load_checkpoint_in_model_takes_accelerates_parameters(tmp_path: Path) -> None:
    from nb_accel.utils import load_checkpoint_in_model, save

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    save(model.state_dict(), tmp_path / "weights.safetensors", safe_serialization=True)
    fresh = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    # Accelerate's positional order: model, checkpoint, device_map, offload_folder, dtype
    load_checkpoint_in_model(
        fresh,
        str(tmp_path / "weights.safetensors"),
        None,
        None,
        torch.float16,
        keep_in_fp32_modules=["1"],
        offload_state_dict=True,
        strict=True,
    )
    assert fresh[0].weight.dtype == torch.float16 and fresh[1].weight.dtype == torch.float32
    assert torch.equal(fresh[1].weight, model[1].weight)
    for refused in ({"full_state_dict": False}, {"broadcast_from_rank0": True}):
        with pytest.raises(NotImplementedError, match="reads whole weights on every process"):
            load_checkpoint_in_model(fresh, str(tmp_path / "weights.safetensors"), **refused)


class _Sizes:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


class _Mesh:
    """Accelerate's device mesh as the loaders read it: named dimensions and their sizes."""

    def __init__(self, **sizes: int) -> None:
        self.mesh_dim_names = tuple(sizes)
        self._sizes = sizes

    def __getitem__(self, name: str) -> _Sizes:
        return _Sizes(self._sizes[name])


def test_prepare_data_loader_shards_over_the_data_parallel_ranks_of_a_mesh() -> None:
    from torch.utils.data import DataLoader

    from nb_accel.data_loader import prepare_data_loader

    loader = DataLoader(list(range(8)), batch_size=2)
    assert [b.tolist() for b in prepare_data_loader(loader, torch_device_mesh=None)] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]
    mesh = _Mesh(dp_shard=2, tp=2)  # ranks 2 and 3 are the second data-parallel place
    for rank in (2, 3):
        shard = prepare_data_loader(
            loader, num_processes=4, process_index=rank, torch_device_mesh=mesh
        )
        assert [b.tolist() for b in shard] == [[2, 3], [6, 7]]
    with pytest.raises(NotImplementedError, match="dispatch_batches=True with tensor"):
        prepare_data_loader(
            loader, num_processes=4, process_index=0, dispatch_batches=True, torch_device_mesh=mesh
        )


def test_the_accelerators_prepare_data_loader_takes_the_dispatchers_slice_function() -> None:
    from torch.utils.data import DataLoader

    from nb_accel.data_loader import DataLoaderDispatcher
    from nb_accel.utils import DataLoaderConfiguration

    def first_row_only(data: torch.Tensor, tensor_slice: slice, **kwargs: object) -> torch.Tensor:
        return data[:1]

    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True)
    )
    loader = accelerator.prepare_data_loader(
        DataLoader(list(range(4)), batch_size=2), slice_fn_for_dispatch=first_row_only
    )
    assert isinstance(loader, DataLoaderDispatcher) and loader.slice_fn is first_row_only
