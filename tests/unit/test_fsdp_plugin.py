"""FullyShardedDataParallelPlugin: Accelerate's fields and environment variables, and the wrap
policies that choose each FSDP unit (no process group needed)."""

from __future__ import annotations

import functools
import os
import warnings
from typing import ClassVar

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, StateDictType
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

import nb_accel
from nb_accel import FullyShardedDataParallelPlugin
from nb_accel.runtime.fsdp import notices
from nb_accel.runtime.fsdp.wrap_policy import ignored_modules, wrapped_modules
from nb_accel.utils import FullyShardedDataParallelPlugin as FromUtils

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh worker process: nothing said yet."""
    monkeypatch.setattr(notices, "_said", set())


class Layer(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.outer = nn.Linear(width, width)


class Model(nn.Module):
    _no_split_modules: ClassVar[list[str]] = ["Layer"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.head = nn.Linear(8, 2)


def _names(model: nn.Module, plugin: FullyShardedDataParallelPlugin) -> list[str]:
    return [name for name, _ in wrapped_modules(model, plugin, ignored_modules(model, plugin))]


def test_the_plugin_is_where_accelerate_has_it() -> None:
    assert FromUtils is FullyShardedDataParallelPlugin is nb_accel.FullyShardedDataParallelPlugin
    from nb_accel.utils.dataclasses import FullyShardedDataParallelPlugin as FromDataclasses

    assert FromDataclasses is FullyShardedDataParallelPlugin


def test_defaults() -> None:
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT
    assert plugin.cpu_offload is False and plugin.activation_checkpointing is False
    assert plugin.take_notes() == []


def test_fields_come_from_accelerates_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "Layer, Other")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.reshard_after_forward is False
    assert plugin.auto_wrap_policy == "transformer_based_wrap"
    assert plugin.transformer_cls_names_to_wrap == ["Layer", "Other"]
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT
    assert plugin.activation_checkpointing is True and plugin.cpu_offload is True
    assert FullyShardedDataParallelPlugin(reshard_after_forward=True).reshard_after_forward


def test_fsdp1_names_are_understood() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy="SHARD_GRAD_OP")
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    notes = dict(plugin.take_notes())
    assert "runs as FSDP2" in notes["fsdp_version=1"] and "sharding_strategy" in notes
    assert FullyShardedDataParallelPlugin(sharding_strategy=1).reshard_after_forward is True
    ignored = FullyShardedDataParallelPlugin(use_orig_params=True, backward_prefetch="BACKWARD_PRE")
    assert set(dict(ignored.take_notes())) == {"use_orig_params", "backward_prefetch"}
    with pytest.raises(ValueError, match="HYBRID_SHARD is not available"):
        FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD")


def test_bad_values_are_errors() -> None:
    with pytest.raises(ValueError, match="use 2"):
        FullyShardedDataParallelPlugin(fsdp_version=3)
    with pytest.raises(ValueError, match="auto_wrap_policy='by_magic'"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="by_magic")
    with pytest.raises(ValueError, match="state_dict_type='LOCAL_STATE_DICT'"):
        FullyShardedDataParallelPlugin(state_dict_type="LOCAL_STATE_DICT")
    with pytest.raises(ValueError, match="not a dtype"):
        FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": "int3"})
    with pytest.raises(ValueError, match="needs activation_checkpointing=True"):
        FullyShardedDataParallelPlugin(activation_checkpointing_offload=True)


def test_mixed_precision_policies() -> None:
    given = FullyShardedDataParallelPlugin(
        mixed_precision_policy={"param_dtype": "bf16", "reduce_dtype": "fp32"}
    )
    assert given.mixed_precision_policy == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    given.set_mixed_precision("fp16")  # kept: the plugin's own policy wins
    assert given.mixed_precision_policy.param_dtype == torch.bfloat16
    derived = FullyShardedDataParallelPlugin()
    derived.set_mixed_precision("bf16")
    assert derived.mixed_precision_policy == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    derived.set_mixed_precision("no", override=True)
    assert derived.mixed_precision_policy is None


def test_wrap_policies_choose_units_children_first() -> None:
    model = Model()
    by_name = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Layer"]
    )
    assert _names(model, by_name) == ["layers.0", "layers.1"]
    assert _names(model, FullyShardedDataParallelPlugin()) == ["layers.0", "layers.1"]  # hint
    assert _names(model, FullyShardedDataParallelPlugin(auto_wrap_policy="no_wrap")) == []
    by_size = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=100)
    assert _names(model, by_size) == ["embed", "layers.0", "layers.1"]  # a Linear is 72
    torch_policy = FullyShardedDataParallelPlugin(
        auto_wrap_policy=functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls={Layer}
        )
    )
    assert _names(model, torch_policy) == ["layers.0", "layers.1"]
    torch_size = FullyShardedDataParallelPlugin(
        auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=400)
    )
    assert _names(model, torch_size) == ["embed"]
    own = FullyShardedDataParallelPlugin(auto_wrap_policy=lambda m: isinstance(m, nn.Linear))
    assert "head" in _names(model, own)


def test_torch_transformer_layers_are_units_by_default() -> None:
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), num_layers=2
    )
    assert _names(encoder, FullyShardedDataParallelPlugin()) == ["layers.0", "layers.1"]
    with pytest.warns(notices.FSDPOptionWarning, match="the whole model is one FSDP unit"):
        assert _names(nn.Linear(3, 3), FullyShardedDataParallelPlugin()) == []


def test_ignored_modules_are_left_out() -> None:
    model = Model()
    plugin = FullyShardedDataParallelPlugin(ignored_modules=r"layers\.1")
    assert ignored_modules(model, plugin) == [model.layers[1]]
    assert _names(model, plugin) == ["layers.0"]
    as_modules = FullyShardedDataParallelPlugin(ignored_modules=[model.head])
    assert ignored_modules(model, as_modules) == [model.head]
    with pytest.raises(ValueError, match="matches no submodule"):
        ignored_modules(model, FullyShardedDataParallelPlugin(ignored_modules="decoder"))
    with pytest.raises(ValueError, match="not part of Model"):
        ignored_modules(model, FullyShardedDataParallelPlugin(ignored_modules=[nn.Linear(1, 1)]))


def test_wrap_policy_errors_name_the_models_classes() -> None:
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    with pytest.raises(ValueError, match=r"its layer classes are: .*Layer"):
        _names(Model(), plugin)
    bare = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    with pytest.raises(ValueError, match="needs the layer classes"):
        _names(nn.Sequential(nn.Linear(2, 2)), bare)


class Plain(nn.Module):
    """The same layers as ``Model``, without a ``_no_split_modules`` hint."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.head = nn.Linear(8, 2)


def _encoder() -> nn.Module:
    return nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), num_layers=2
    )


#: Every policy that chooses by layer class, none naming the classes.
BY_CLASS_UNNAMED = {
    "default": None,
    "transformer_based_wrap": "transformer_based_wrap",
    "torch's transformer_auto_wrap_policy": transformer_auto_wrap_policy,
    "a partial of it without classes": functools.partial(transformer_auto_wrap_policy),
}


@pytest.mark.parametrize("policy", list(BY_CLASS_UNNAMED.values()), ids=list(BY_CLASS_UNNAMED))
def test_every_policy_by_class_finds_the_same_layers_when_none_are_named(policy: object) -> None:
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy=policy)  # type: ignore[arg-type]
    assert _names(Model(), plugin) == ["layers.0", "layers.1"]  # _no_split_modules
    assert _names(_encoder(), plugin) == ["layers.0", "layers.1"]  # nn.TransformerEncoderLayer
    named = FullyShardedDataParallelPlugin(
        auto_wrap_policy=policy,  # type: ignore[arg-type]
        transformer_cls_names_to_wrap=["Layer"],
    )
    assert _names(Plain(), named) == ["layers.0", "layers.1"]  # the names win, default included


@pytest.mark.parametrize(
    "policy",
    [p for p in BY_CLASS_UNNAMED.values() if p is not None],
    ids=list(BY_CLASS_UNNAMED)[1:],
)
def test_a_policy_by_class_that_finds_no_layer_says_so(policy: object) -> None:
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy=policy)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"needs the layer classes.*Plain has no _no_split") as e:
        _names(Plain(), plugin)
    assert "Layer" in str(e.value)  # the classes it has, to choose from


def test_the_default_says_once_that_the_whole_model_is_one_unit() -> None:
    with pytest.warns(notices.FSDPOptionWarning, match=r"Plain has no layer .* one FSDP unit"):
        assert _names(Plain(), FullyShardedDataParallelPlugin()) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _names(Plain(), FullyShardedDataParallelPlugin()) == []  # said already
        assert _names(Plain(), FullyShardedDataParallelPlugin(auto_wrap_policy="no_wrap")) == []


def test_accelerates_plugin_without_class_names_falls_back_as_ours_does() -> None:
    accelerate_utils = pytest.importorskip("accelerate.utils")
    from nb_accel.runtime.sharding.fsdp2 import fsdp_plugin_from

    try:
        theirs = accelerate_utils.FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap"
        )
        ours = fsdp_plugin_from(theirs)
    finally:  # both plugins publish this one for Transformers
        os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
    assert ours is not None and ours.auto_wrap_policy is transformer_auto_wrap_policy
    assert _names(Model(), ours) == ["layers.0", "layers.1"]  # not one unit for the whole model
    assert _names(_encoder(), ours) == ["layers.0", "layers.1"]
    with pytest.raises(ValueError, match="needs the layer classes"):
        _names(Plain(), ours)


def test_a_single_process_says_it_does_not_shard() -> None:
    with pytest.warns(UserWarning, match="this run has a single process"):
        accelerator = nb_accel.Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    assert not accelerator.is_fsdp2 and accelerator.fsdp_plugin is None
    model = accelerator.prepare(nn.Linear(2, 2))
    assert type(model) is nn.Linear


def test_accelerates_own_plugin_is_taken_over() -> None:
    accelerate_utils = pytest.importorskip("accelerate.utils")
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy

    from nb_accel.runtime.sharding.fsdp2 import fsdp_plugin_from

    try:
        theirs = accelerate_utils.FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["Layer"],
            state_dict_type="FULL_STATE_DICT",
            cpu_offload=True,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing said about options Accelerate filled in
            ours = fsdp_plugin_from(theirs)
    finally:  # both plugins publish this one for Transformers
        os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
    assert isinstance(ours, FullyShardedDataParallelPlugin)
    assert ours.state_dict_type == StateDictType.FULL_STATE_DICT
    assert isinstance(ours.cpu_offload, CPUOffloadPolicy)
    assert _names(Model(), ours) == ["layers.0", "layers.1"]
    fsdp1 = FullyShardedDataParallelPlugin(cpu_offload=CPUOffload(offload_params=False))
    assert fsdp1.cpu_offload == CPUOffload(offload_params=False)
