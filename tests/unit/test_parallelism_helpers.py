"""The mesh's helpers on the CPU: what context parallelism changes in a prepared model (the
attention modules of a ``transformers`` model attend causally without their masks, as torch's
ring attention takes none; a model with sliding-window layers is refused; without ``cp_size``
the training block leaves its buffers whole), and torch's advice on flattening the mesh held
back where nb_accel gathers tensor parallel weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from nb_accel import Accelerator
from nb_accel.runtime.parallelism.context import drop_attention_masks

pytestmark = pytest.mark.timeout(60)


class Attention(nn.Module):
    """Records the keyword arguments its forward gets."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.seen = kwargs
        return x


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = Attention()
        self.mlp = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(2, 2)
        return self.mlp(self.self_attn(x, attention_mask=mask), attention_mask=mask)


class Config:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def test_the_attention_modules_attend_causally_without_their_masks() -> None:
    layer = Layer()
    drop_attention_masks(layer)
    layer(torch.ones(2))
    assert layer.self_attn.seen == {"attention_mask": None, "is_causal": True}
    assert layer.mlp.seen["attention_mask"] is not None  # not an attention module: left as is


@pytest.mark.parametrize(
    "config",
    [
        Config(layer_types=["full_attention", "sliding_attention"]),
        Config(sliding_window=4096),  # older models: every layer windowed when it is set
    ],
)
def test_a_model_with_windowed_attention_is_refused(config: Config) -> None:
    layer = Layer()
    layer.config = config  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"attention layers of type \['sliding_attention'\]"):
        drop_attention_masks(layer)


def test_without_context_parallelism_the_block_leaves_the_buffers_whole() -> None:
    accelerator = Accelerator(cpu=True)
    buffer = torch.arange(8).reshape(1, 8)
    with accelerator.maybe_context_parallel(buffers=[buffer], buffer_seq_dims=[1]):
        assert buffer.shape == (1, 8)


def test_torchs_advice_on_flattening_the_mesh_is_held_back_where_nb_accel_gathers() -> None:
    import logging

    from nb_accel.runtime.parallelism.tensor import quiet_redistribution

    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    before = logger.level
    with quiet_redistribution():
        assert not logger.isEnabledFor(logging.WARNING)
    assert logger.level == before and logger.isEnabledFor(logging.WARNING)
