"""FSDP options that do nothing where they are given: each said once per process, naming the
option and why (no process group needed)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

from nb_accel import FullyShardedDataParallelPlugin
from nb_accel.runtime.fsdp import notices
from nb_accel.runtime.fsdp.plugin import FSDP1_WHY
from nb_accel.runtime.fsdp.sharding import _offload_policy
from nb_accel.runtime.fsdp.wrap_policy import wrapped_modules
from nb_accel.runtime.sharding.fsdp2 import fsdp_plugin_from

pytestmark = pytest.mark.timeout(60)

FSDP1_GIVEN = {
    "backward_prefetch": "BACKWARD_PRE",
    "limit_all_gathers": True,
    "use_orig_params": True,
    "sync_module_states": True,
    "forward_prefetch": True,
    "param_init_fn": lambda module: module,
    "state_dict_config": object(),
    "optim_state_dict_config": object(),
}


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh worker process: nothing said yet."""
    monkeypatch.setattr(notices, "_said", set())


def _said(record: list[warnings.WarningMessage]) -> dict[str, str]:
    """The options the recorded warnings name, with their text."""
    found = {}
    for warning in record:
        assert issubclass(warning.category, notices.FSDPOptionWarning)
        text = str(warning.message).removeprefix("FullyShardedDataParallelPlugin(")
        option, _, rest = text.partition("): ")
        assert option not in found, f"{option} said twice"
        found[option] = rest
    return found


def test_every_fsdp1_option_is_said_once_with_its_reason() -> None:
    assert set(FSDP1_GIVEN) == set(FSDP1_WHY)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fsdp_plugin_from(FullyShardedDataParallelPlugin(**FSDP1_GIVEN))
        fsdp_plugin_from(FullyShardedDataParallelPlugin(**FSDP1_GIVEN))  # a second Accelerator
    said = _said(record)
    assert set(said) == set(FSDP1_GIVEN)
    for option, text in said.items():
        assert text == f"no effect under FSDP2, {FSDP1_WHY[option]}"
    assert "rank 0's weights" in said["sync_module_states"]


def test_options_left_out_or_off_say_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fsdp_plugin_from(FullyShardedDataParallelPlugin(limit_all_gathers=False))
        fsdp_plugin_from(
            FullyShardedDataParallelPlugin(mixed_precision_policy={"buffer_dtype": None})
        )


def test_a_buffer_dtype_is_said_to_do_nothing() -> None:
    plugin = FullyShardedDataParallelPlugin(
        mixed_precision_policy={"param_dtype": "bf16", "buffer_dtype": "bf16"}
    )
    assert plugin.mixed_precision_policy.param_dtype == torch.bfloat16
    with pytest.warns(notices.FSDPOptionWarning) as record:
        fsdp_plugin_from(plugin)
    said = _said(record.list)
    assert said == {
        "mixed_precision_policy['buffer_dtype']": (
            "no effect, FSDP2's mixed precision leaves buffers in their own dtype"
        )
    }


def test_cpu_offload_on_the_cpu_is_said_once_and_keeps_the_shards_in_place() -> None:
    plugin = FullyShardedDataParallelPlugin(cpu_offload=True)
    assert plugin.offloads_to_cpu
    with pytest.warns(notices.FSDPOptionWarning, match=r"cpu_offload\): no effect, this launch"):
        policy = _offload_policy(plugin, torch.device("cpu"))
    assert type(policy) is OffloadPolicy  # not CPUOffloadPolicy: nothing moves
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _offload_policy(plugin, torch.device("cpu"))  # the next model: said already
        assert type(_offload_policy(FullyShardedDataParallelPlugin(), torch.device("cpu"))) is (
            OffloadPolicy
        )


def test_what_counts_as_offloading() -> None:
    from torch.distributed.fsdp import CPUOffload

    assert FullyShardedDataParallelPlugin(cpu_offload=CPUOffloadPolicy()).offloads_to_cpu
    assert FullyShardedDataParallelPlugin(
        cpu_offload=CPUOffload(offload_params=True)
    ).offloads_to_cpu
    assert not FullyShardedDataParallelPlugin(cpu_offload=OffloadPolicy()).offloads_to_cpu
    assert not FullyShardedDataParallelPlugin(cpu_offload=CPUOffload()).offloads_to_cpu
    assert not FullyShardedDataParallelPlugin().offloads_to_cpu


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])


@pytest.mark.parametrize(
    "options, option",
    [
        (
            {"auto_wrap_policy": "size_based_wrap", "transformer_cls_names_to_wrap": ["Linear"]},
            "transformer_cls_names_to_wrap",
        ),
        (
            {"auto_wrap_policy": "no_wrap", "transformer_cls_names_to_wrap": ["Linear"]},
            "transformer_cls_names_to_wrap",
        ),
        (
            {
                "auto_wrap_policy": "transformer_based_wrap",
                "transformer_cls_names_to_wrap": ["Linear"],
                "min_num_params": 10,
            },
            "min_num_params",
        ),
        ({"auto_wrap_policy": lambda m: False, "min_num_params": 10}, "min_num_params"),
    ],
    ids=["names-by-size", "names-no-wrap", "size-by-class", "size-own-function"],
)
def test_wrap_options_the_policy_does_not_read_are_said(
    options: dict[str, object], option: str
) -> None:
    plugin = FullyShardedDataParallelPlugin(**options)  # type: ignore[arg-type]
    with pytest.warns(notices.FSDPOptionWarning) as record:
        wrapped_modules(Model(), plugin)
    assert list(_said(record.list)) == [option]
    assert "does not choose layers by" in str(record.list[0].message)


def test_activation_checkpointing_without_units_says_so() -> None:
    from nb_accel.runtime.fsdp.activations import checkpoint_units

    with pytest.warns(notices.FSDPOptionWarning, match=r"activation_checkpointing\): no effect"):
        assert checkpoint_units(Model(), [], offload=False) == []
