"""Accelerate's names and import paths exist under ``nb_accel``: renaming the package is the
whole migration."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import nb_accel
import nb_accel.data_loader
import nb_accel.utils
from nb_accel.utils import (
    DistributedType,
    LoggerType,
    PrecisionType,
    find_executable_batch_size,
    is_cuda_available,
    is_datasets_available,
    is_mlflow_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_transformers_available,
    is_wandb_available,
    patch_environment,
)

pytestmark = pytest.mark.timeout(60)

#: Every member of Accelerate 1.15's enums, with its value.
DISTRIBUTED_TYPES = [
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
    "MULTI_HPU",
    "MULTI_NEURON",
]
PRECISIONS = {"NO": "no", "FP8": "fp8", "FP16": "fp16", "BF16": "bf16"}
LOGGERS = {
    "ALL": "all",
    "AIM": "aim",
    "TENSORBOARD": "tensorboard",
    "WANDB": "wandb",
    "TRACKIO": "trackio",
    "COMETML": "comet_ml",
    "MLFLOW": "mlflow",
    "CLEARML": "clearml",
    "DVCLIVE": "dvclive",
    "SWANLAB": "swanlab",
}


@pytest.mark.parametrize("name", DISTRIBUTED_TYPES)
def test_every_distributed_type_accelerate_has_exists_with_its_value(name: str) -> None:
    member = getattr(DistributedType, name)
    assert member.value == name and member == name
    assert nb_accel.DistributedType is DistributedType


def test_a_guard_for_a_setup_nb_accel_does_not_run_is_false() -> None:
    state = nb_accel.PartialState()
    assert state.distributed_type != DistributedType.DEEPSPEED
    assert state.distributed_type not in (DistributedType.FSDP, DistributedType.MEGATRON_LM)
    assert json.dumps(DistributedType.FSDP) == '"FSDP"'


def test_precision_and_logger_types_match_accelerate() -> None:
    assert {m.name: m.value for m in PrecisionType} == PRECISIONS
    assert {m.name: m.value for m in LoggerType} == LOGGERS
    assert PrecisionType.BF16 == "bf16" and str(PrecisionType.FP16) == "fp16"
    assert "fp16" in PrecisionType and "int3" not in PrecisionType
    assert str(LoggerType.WANDB) == "wandb" and "tensorboard" in LoggerType
    assert LoggerType.list() == list(LOGGERS.values())
    assert PrecisionType.list() == list(PRECISIONS.values())


#: Accelerate's import paths and the nb_accel names they must give (the same objects).
PATHS = {
    "nb_accel.data_loader": {
        "DataLoaderShard": "nb_accel.runtime.data.loaders",
        "DataLoaderDispatcher": "nb_accel.runtime.data.loaders",
        "DataLoaderStateMixin": "nb_accel.runtime.data.loaders",
        "SkipDataLoader": "nb_accel.runtime.data.loaders",
        "prepare_data_loader": "nb_accel.runtime.data.loaders",
        "skip_first_batches": "nb_accel.runtime.data.loaders",
        "BatchSamplerShard": "nb_accel.runtime.data.sampling",
        "IterableDatasetShard": "nb_accel.runtime.data.sampling",
        "SeedableRandomSampler": "nb_accel.runtime.data.sampling",
        "SkipBatchSampler": "nb_accel.runtime.data.sampling",
    },
    "nb_accel.state": {
        name: "nb_accel.runtime.state"
        for name in ("PartialState", "AcceleratorState", "GradientState", "DistributedType")
    },
    "nb_accel.optimizer": {"AcceleratedOptimizer": "nb_accel.runtime.training.optimizer"},
    "nb_accel.scheduler": {"AcceleratedScheduler": "nb_accel.runtime.training.scheduler"},
    "nb_accel.logging": {
        "get_logger": "nb_accel.worker.reporting.logger",
        "MultiProcessAdapter": "nb_accel.worker.reporting.logger",
    },
}


@pytest.mark.parametrize("path", PATHS)
def test_accelerates_import_paths_give_nb_accels_objects(path: str) -> None:
    module = importlib.import_module(path)
    for name, home in PATHS[path].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
    assert sorted(module.__all__) == sorted(PATHS[path])


def test_get_logger_is_a_logger_adapter_on_the_named_logger() -> None:
    from nb_accel.logging import get_logger

    root_level = logging.getLogger().level
    logger = get_logger("nb_accel_test_adapter", log_level="debug")
    try:
        assert isinstance(logger, logging.LoggerAdapter)
        assert logger.logger is logging.getLogger("nb_accel_test_adapter")
        assert logger.logger.level == logging.DEBUG
    finally:
        logger.logger.setLevel(logging.NOTSET)
        logging.getLogger().setLevel(root_level)


def test_accelerates_top_level_names_exist() -> None:
    for name in (
        "find_executable_batch_size",
        "synchronize_rng_states",
        "AutocastKwargs",
        "DistributedDataParallelKwargs",
        "GradScalerKwargs",
        "DataLoaderConfiguration",
        "load_checkpoint_in_model",
    ):
        assert getattr(nb_accel, name) is getattr(nb_accel.utils, name), name
    assert nb_accel.skip_first_batches is nb_accel.data_loader.skip_first_batches


def test_patch_environment_sets_upper_case_strings_and_restores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NB_ACCEL_TEST_KEPT", "before")
    monkeypatch.delenv("NB_ACCEL_TEST_NEW", raising=False)
    with pytest.raises(KeyError), patch_environment(nb_accel_test_kept=1, NB_ACCEL_TEST_NEW=True):
        assert os.environ["NB_ACCEL_TEST_KEPT"] == "1"
        assert os.environ["NB_ACCEL_TEST_NEW"] == "True"
        raise KeyError("the variables are restored on the way out of an exception too")
    assert os.environ["NB_ACCEL_TEST_KEPT"] == "before"
    assert "NB_ACCEL_TEST_NEW" not in os.environ


def test_availability_checks_never_import_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("wandb", "mlflow", "tensorboard", "transformers", "datasets", "torch_xla"):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text("raise AssertionError('imported')\n")
        info = tmp_path / f"{name}-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)  # (an earlier test of the session may have imported one)
    for check in (
        is_wandb_available,
        is_mlflow_available,
        is_tensorboard_available,
        is_transformers_available,
        is_datasets_available,
        is_torch_xla_available,
    ):
        assert check() is True, check.__name__
    assert not {"wandb", "mlflow", "tensorboard", "transformers", "datasets", "torch_xla"} & (
        set(sys.modules) - before
    )
    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    assert is_torch_xla_available(check_is_gpu=True) and not is_torch_xla_available(
        check_is_tpu=True
    )
    assert is_cuda_available() is False and not torch.cuda.is_initialized()


def test_an_absent_library_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    assert not is_wandb_available() and not is_torch_xla_available()


def test_find_executable_batch_size_retries_smaller_after_out_of_memory() -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int, model: str, *, steps: int) -> tuple[int, str, int]:
        tried.append(batch_size)
        if batch_size > 40:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if batch_size > 30:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to ...")
        return batch_size, model, steps

    assert train("m", steps=3) == (28, "m", 3)
    assert tried == [64, 57, 51, 45, 40, 36, 32, 28]
    assert train("m", steps=1) == (28, "m", 1)  # starts where the last call ended


def test_find_executable_batch_size_lets_other_errors_through_and_stops_at_zero() -> None:
    @find_executable_batch_size(starting_batch_size=4, reduce_batch_size_fn=None)
    def broken(batch_size: int) -> None:
        raise ValueError("not a memory problem")

    with pytest.raises(ValueError, match="not a memory problem"):
        broken()
    with pytest.raises(TypeError, match="leave it out"):
        broken(4)

    sizes = iter([2, 1, 0])

    @find_executable_batch_size(starting_batch_size=3, reduce_batch_size_fn=lambda: next(sizes))
    def never_fits(batch_size: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="every batch size"):
        never_fits()


def test_destroy_process_group_outside_a_launch_destroys_the_default_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NB_ACCEL_LAUNCHED", raising=False)
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        nb_accel.PartialState().destroy_process_group()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_trackers_availability_checks_find_a_library_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nb_accel.utils import imports

    modules = {
        "trackio": "trackio",
        "aim": "aim",
        "comet_ml": "comet-ml",
        "clearml": "clearml",
        "dvclive": "dvclive",
        "swanlab": "swanlab",
    }
    checks = {name: getattr(imports, f"is_{name}_available") for name in modules}
    # (sys.path is replaced, never prepended to: monkeypatch would restore a prepended path
    # to the filtered one)
    without_site = [p for p in sys.path if "site-packages" not in p]
    monkeypatch.setattr(sys, "path", without_site)
    assert not any(check() for check in checks.values())
    for module, distribution in modules.items():
        package = tmp_path / module
        package.mkdir()
        (package / "__init__.py").write_text("raise AssertionError('imported')\n")
        info = tmp_path / f"{distribution.replace('-', '_')}-0.0.dist-info"
        info.mkdir()
        metadata = f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.0\n"
        (info / "METADATA").write_text(metadata)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *without_site])
    importlib.invalidate_caches()
    assert all(check() for check in checks.values())
    assert not set(modules) & set(sys.modules)


#: The names of Accelerate 1.15's package reference (accelerator, state, kwargs handlers,
#: launchers, logging, tracking, FSDP, torch wrappers, utilities), by the import path its
#: documentation gives them. Each imports from the same path with ``accelerate`` replaced by
#: ``nb_accel``, but those in ``NOT_PROVIDED``.
DOCUMENTED: dict[str, tuple[str, ...]] = {
    "accelerate": (
        "Accelerator",
        "AutocastKwargs",
        "DataLoaderConfiguration",
        "DeepSpeedPlugin",
        "DistributedDataParallelKwargs",
        "DistributedType",
        "FullyShardedDataParallelPlugin",
        "GradScalerKwargs",
        "InitProcessGroupKwargs",
        "ParallelismConfig",
        "PartialState",
        "ProfileKwargs",
        "debug_launcher",
        "find_executable_batch_size",
        "infer_auto_device_map",
        "is_rich_available",
        "load_checkpoint_in_model",
        "notebook_launcher",
        "skip_first_batches",
        "synchronize_rng_states",
        # big model inference
        "cpu_offload",
        "cpu_offload_with_hook",
        "disk_offload",
        "dispatch_model",
        "init_empty_weights",
        "init_on_device",
        "load_checkpoint_and_dispatch",
        "prepare_pippy",
    ),
    "accelerate.accelerator": ("Accelerator",),
    "accelerate.state": ("PartialState", "AcceleratorState", "GradientState"),
    "accelerate.logging": ("get_logger",),
    "accelerate.parallelism_config": ("ParallelismConfig",),
    "accelerate.data_loader": (
        "prepare_data_loader",
        "skip_first_batches",
        "BatchSamplerShard",
        "IterableDatasetShard",
        "DataLoaderShard",
        "DataLoaderDispatcher",
    ),
    "accelerate.optimizer": ("AcceleratedOptimizer",),
    "accelerate.scheduler": ("AcceleratedScheduler",),
    "accelerate.tracking": (
        "GeneralTracker",
        "TensorBoardTracker",
        "WandBTracker",
        "TrackioTracker",
        "CometMLTracker",
        "AimTracker",
        "MLflowTracker",
        "ClearMLTracker",
        "DVCLiveTracker",
        "SwanLabTracker",
    ),
    "accelerate.commands.config.default": ("write_basic_config",),
    "accelerate.utils.environment": ("override_numa_affinity",),
    "accelerate.utils": (
        # constants
        "MODEL_NAME",
        "OPTIMIZER_NAME",
        "RNG_STATE_NAME",
        "SCALER_NAME",
        "SCHEDULER_NAME",
        "WEIGHTS_NAME",
        "SAFE_WEIGHTS_NAME",
        "WEIGHTS_INDEX_NAME",
        "SAFE_WEIGHTS_INDEX_NAME",
        # data classes, kwargs handlers, plugins, configurations
        "ComputeEnvironment",
        "DistributedType",
        "DynamoBackend",
        "LoggerType",
        "PrecisionType",
        "RNGType",
        "SageMakerDistributedType",
        "AutocastKwargs",
        "DistributedDataParallelKwargs",
        "FP8RecipeKwargs",
        "GradScalerKwargs",
        "InitProcessGroupKwargs",
        "KwargsHandler",
        "ProfileKwargs",
        "DeepSpeedPlugin",
        "FullyShardedDataParallelPlugin",
        "GradientAccumulationPlugin",
        "MegatronLMPlugin",
        "TorchDynamoPlugin",
        "TorchTensorParallelPlugin",
        "TorchContextParallelConfig",
        "TorchTensorParallelConfig",
        "BnbQuantizationConfig",
        "DataLoaderConfiguration",
        "ProjectConfiguration",
        # data manipulation and operations
        "broadcast",
        "broadcast_object_list",
        "concatenate",
        "convert_outputs_to_fp32",
        "convert_to_fp32",
        "gather",
        "gather_object",
        "get_grad_scaler",
        "get_mixed_precision_context_manager",
        "listify",
        "pad_across_processes",
        "recursively_apply",
        "reduce",
        "send_to_device",
        "slice_tensors",
        # environment checks and manipulation
        "is_bf16_available",
        "is_mps_available",
        "is_npu_available",
        "is_torch_version",
        "is_torch_xla_available",
        "is_xpu_available",
        "patch_environment",
        "clear_environment",
        "write_basic_config",
        "set_numa_affinity",
        "purge_accelerate_environment",
        # memory, modeling, parallel, random
        "find_executable_batch_size",
        "release_memory",
        "calculate_maximum_sizes",
        "compute_module_sizes",
        "extract_model_from_parallel",
        "get_balanced_memory",
        "get_max_layer_size",
        "infer_auto_device_map",
        "load_checkpoint_in_model",
        "load_offloaded_weights",
        "load_state_dict",
        "offload_state_dict",
        "retie_parameters",
        "set_module_tensor_to_device",
        "get_module_children_bottom_up",
        "compile_regions",
        "save",
        "load",
        "wait_for_everyone",
        "set_seed",
        "synchronize_rng_state",
        "synchronize_rng_states",
        # XLA, quantization
        "install_xla",
        "load_and_quantize_model",
        # FSDP
        "enable_fsdp_ram_efficient_loading",
        "disable_fsdp_ram_efficient_loading",
        "merge_fsdp_weights",
        "fsdp2_load_full_state_dict",
        "fsdp2_switch_optimizer_parameters",
        "fsdp2_prepare_model",
    ),
    "accelerate.utils.fsdp_utils": ("merge_fsdp_weights", "fsdp2_prepare_auto_wrap_policy"),
}

_BIG_MODELING = (
    "big-model inference (device maps, offloading weights to the CPU or a disk) is outside "
    "nb_accel, which trains a whole model, or FSDP2 shards of it, on every process"
)
_FSDP2_STEPS = "a step of Accelerate's own FSDP2 preparation: prepare() does it in nb_accel"
#: Documented names nb_accel deliberately leaves out, with the reason; importing them fails.
NOT_PROVIDED: dict[tuple[str, str], str] = {
    **{
        ("accelerate", name): _BIG_MODELING
        for name in (
            "cpu_offload",
            "cpu_offload_with_hook",
            "disk_offload",
            "dispatch_model",
            "init_empty_weights",
            "init_on_device",
            "load_checkpoint_and_dispatch",
            "infer_auto_device_map",
        )
    },
    **{
        ("accelerate.utils", name): _BIG_MODELING
        for name in (
            "calculate_maximum_sizes",
            "compute_module_sizes",
            "get_balanced_memory",
            "get_max_layer_size",
            "infer_auto_device_map",
            "load_offloaded_weights",
            "load_state_dict",
            "offload_state_dict",
            "retie_parameters",
            "set_module_tensor_to_device",
        )
    },
    **{
        ("accelerate.utils", name): _FSDP2_STEPS
        for name in (
            "fsdp2_load_full_state_dict",
            "fsdp2_switch_optimizer_parameters",
            "fsdp2_prepare_model",
        )
    },
    ("accelerate.utils.fsdp_utils", "fsdp2_prepare_auto_wrap_policy"): _FSDP2_STEPS,
    ("accelerate", "prepare_pippy"): "pipeline parallelism is not supported",
    ("accelerate.utils", "BnbQuantizationConfig"): "bitsandbytes quantization is outside nb_accel",
    (
        "accelerate.utils",
        "load_and_quantize_model",
    ): "bitsandbytes quantization is outside nb_accel",
    ("accelerate.utils", "install_xla"): "install torch_xla with pip: the nb_accel[xla] extra",
    ("accelerate.utils", "set_numa_affinity"): "nb_accel's launcher does not pin NUMA nodes",
    ("accelerate.utils.environment", "override_numa_affinity"): (
        "nb_accel's launcher does not pin NUMA nodes"
    ),
    ("accelerate.commands.config.default", "write_basic_config"): (
        "nb_accel has no command line: the function is nb_accel.utils.write_basic_config"
    ),
}
#: Documented classes of engines nb_accel does not run: they import, and making one raises
#: ``NotImplementedError`` (as passing their parameter to ``Accelerator`` does); the older tensor
#: parallelism plugin names ``ParallelismConfig(tp_size=N)``, through which tensor parallelism runs.
REFUSED_WHEN_MADE = {
    "DeepSpeedPlugin": "DeepSpeed",
    "MegatronLMPlugin": "Megatron-LM",
    "TorchTensorParallelPlugin": "this plugin",
    "FP8RecipeKwargs": "FP8 training",
}


def _ours(path: str) -> str:
    return "nb_accel" + path[len("accelerate") :]


def _documented() -> list[tuple[str, str]]:
    return [(path, name) for path, names in DOCUMENTED.items() for name in names]


@pytest.mark.parametrize(("path", "name"), _documented(), ids="{0[0]}.{0[1]}".format)
def test_every_documented_name_imports_from_nb_accel_where_accelerate_has_it(
    path: str, name: str
) -> None:
    reason = NOT_PROVIDED.get((path, name))
    try:
        found = getattr(importlib.import_module(_ours(path)), name)
    except (ImportError, AttributeError):
        assert reason is not None, f"{_ours(path)}.{name} is missing (documented at {path})"
        return
    assert reason is None, f"{_ours(path)}.{name} exists: take it out of NOT_PROVIDED"
    assert found is not None


def test_the_lists_of_names_left_out_name_documented_names_only() -> None:
    documented = set(_documented())
    assert set(NOT_PROVIDED) <= documented
    assert all(reason for reason in NOT_PROVIDED.values())
    assert {("accelerate.utils", name) for name in REFUSED_WHEN_MADE} <= documented


@pytest.mark.parametrize("name", REFUSED_WHEN_MADE)
def test_the_other_engines_classes_import_and_are_refused_when_made(name: str) -> None:
    kind = getattr(nb_accel.utils, name)
    assert getattr(importlib.import_module("nb_accel.utils.dataclasses"), name) is kind
    with pytest.raises(NotImplementedError, match=f"{REFUSED_WHEN_MADE[name]} is not supported"):
        kind()


def test_the_documented_names_are_accelerates() -> None:
    """The lists above hold Accelerate's names at Accelerate's paths (where it is installed)."""
    pytest.importorskip("accelerate")
    for path, name in _documented():
        module = importlib.import_module(path)
        assert hasattr(module, name), f"{path}.{name} is not in the installed Accelerate"


#: Public members of Accelerate's ``Accelerator`` that nb_accel's leaves out, with the reason.
ACCELERATOR_LEFT_OUT = {
    "deepspeed_ulysses_dl_adapter": "DeepSpeed's sequence parallelism is not supported",
    "should_save_model": "a step of Accelerate's saving under a device mesh",
}


def test_the_accelerator_has_every_public_member_accelerates_has() -> None:
    accelerate = pytest.importorskip("accelerate")
    theirs = {name for name in dir(accelerate.Accelerator) if not name.startswith("_")}
    ours = {name for name in dir(nb_accel.Accelerator) if not name.startswith("_")}
    assert sorted(theirs - ours - set(ACCELERATOR_LEFT_OUT)) == []
    assert set(ACCELERATOR_LEFT_OUT) <= theirs - ours


def test_the_accelerators_members_for_what_nb_accel_does_not_run() -> None:
    accelerator = nb_accel.Accelerator(cpu=True)
    assert accelerator.deepspeed_plugin is None and accelerator.fp8_backend is None
    assert (
        accelerator.multi_device is False and accelerator.is_composable_parallelism_enabled is False
    )
    assert accelerator.non_blocking is False
    buffers = [torch.arange(4)]
    with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[0]):
        assert buffers[0].tolist() == [0, 1, 2, 3]  # no context parallelism: left whole
    with pytest.raises(NotImplementedError, match="pipeline parallelism is not supported"):
        _ = accelerator.pipeline_parallel_rank
    with pytest.raises(RuntimeError, match="Context parallelism is not configured"):
        _ = accelerator.context_parallel_rank
    with pytest.raises(NotImplementedError, match="LOMO optimizers are not supported"):
        accelerator.lomo_backward(torch.ones(()), learning_rate=0.1)
    model = torch.nn.Sequential(torch.nn.Linear(1, 1))
    assert accelerator.verify_device_map(model) is False
    model[0].hf_device_map = {"a": 0, "b": "cpu"}  # type: ignore[assignment]
    assert accelerator.verify_device_map(model) is True


#: Public members of Accelerate's state classes that nb_accel's leave out, with the reason.
STATE_LEFT_OUT = {
    ("AcceleratorState", "fork_launched"): "nb_accel's workers do not read FORK_LAUNCHED",
    ("GradientState", "is_xla_gradients_synced"): (
        "Accelerate's TPU bookkeeping: nb_accel's XLA device backend reduces the gradients in "
        "its optimizer step"
    ),
}


def test_the_state_classes_have_every_public_member_accelerates_have() -> None:
    accelerate_state = pytest.importorskip("accelerate.state")
    nb_accel.Accelerator(cpu=True)
    for name in ("PartialState", "AcceleratorState", "GradientState"):
        ours = getattr(nb_accel.state, name)()
        theirs = {m for m in dir(getattr(accelerate_state, name)) if not m.startswith("_")}
        missing = {m for m in theirs if not hasattr(ours, m)}
        assert missing == {m for (cls, m) in STATE_LEFT_OUT if cls == name}, name


def test_the_state_members_for_what_nb_accel_does_not_run() -> None:
    accelerator = nb_accel.Accelerator(cpu=True)
    state, partial = accelerator.state, nb_accel.PartialState()
    assert state.is_fsdp2 is False and state.deepspeed_plugin is None
    with pytest.raises(NotImplementedError, match="DeepSpeed is not supported"):
        state.select_deepspeed_plugin("default")
    assert partial.default_device.type in ("cuda", "mps", "cpu")
    partial.set_device()
    assert partial.device == accelerator.device


#: Parameters of Accelerate's documented callables that nb_accel's do not name, with why (a
#: parameter taken through ``**kwargs`` is listed too, with how it is handled there).
PARAMETERS_LEFT_OUT: dict[tuple[str, str], dict[str, str]] = {}


def _provided_callables() -> list[tuple[str, str, Any, Any]]:
    """Accelerate's documented callables that nb_accel provides: (path, name, theirs, ours)."""
    found = []
    for path, name in _documented():
        if (path, name) in NOT_PROVIDED or name in REFUSED_WHEN_MADE:
            continue
        theirs = getattr(importlib.import_module(path), name)
        ours = getattr(importlib.import_module(_ours(path)), name)
        if not callable(theirs) or (isinstance(theirs, type) and issubclass(theirs, Enum)):
            continue
        found.append((path, name, theirs, ours))
    return found


def test_the_documented_callables_take_accelerates_parameters() -> None:
    """Every named parameter of Accelerate's callable (its private ones such as
    ``_from_accelerator`` too) is a named parameter of nb_accel's, but those listed in
    ``PARAMETERS_LEFT_OUT``: a ``**kwargs`` of ours does not count, since it may swallow a
    parameter it does not handle."""
    pytest.importorskip("accelerate")
    gaps = []
    for path, name, theirs, ours in _provided_callables():
        our_names = _named_parameters(ours)
        left_out = PARAMETERS_LEFT_OUT.get((path, name), {})
        missing = [p for p in _named_parameters(theirs) if p not in our_names and p not in left_out]
        if missing:
            gaps.append(f"{path}.{name}: {missing}")
    assert gaps == []


def test_the_parameters_left_out_are_accelerates_and_not_ours() -> None:
    pytest.importorskip("accelerate")
    callables = {(path, name): (theirs, ours) for path, name, theirs, ours in _provided_callables()}
    for key, reasons in PARAMETERS_LEFT_OUT.items():
        theirs, ours = callables[key]
        for parameter, reason in reasons.items():
            assert reason, (key, parameter)
            assert parameter in _named_parameters(theirs), (key, parameter)
            assert parameter not in _named_parameters(ours), f"{key}: {parameter} is ours now"


def _named_parameters(function: Any) -> list[str]:
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return []
    return [n for n, p in parameters.items() if p.kind not in kinds and n != "self"]
