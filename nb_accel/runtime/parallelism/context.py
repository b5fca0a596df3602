"""Context parallelism on torch's ``context_parallel`` (CUDA GPUs): each rank of a ``cp`` group
holds a slice of every sequence, and attention passes the keys and values around the group.
What a prepared model needs for it (its attention masks left out: torch's ring attention is
causal or nothing), and the block a training step runs in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["context_parallel_block", "drop_attention_masks"]


def drop_attention_masks(model: torch.nn.Module) -> None:
    """Have each ``self_attn`` module of ``model`` (a ``transformers`` model's attention)
    attend causally without its mask: torch's context parallel attention takes none. A model
    whose layers use a stricter mask than causal (sliding windows) is refused, as its mask
    would be lost."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    kinds = getattr(config, "layer_types", None)
    if kinds is not None:
        stricter = sorted({kind for kind in kinds if kind != "full_attention"})
    else:
        stricter = ["sliding_attention"] if getattr(config, "sliding_window", None) else []
    if stricter:
        raise ValueError(
            f"context parallelism attends causally over whole sequences, and "
            f"{type(model).__name__} has attention layers of type {stricter}, whose masks "
            "would be dropped: use a model with full attention, or leave cp_size at 1"
        )
    for name, module in model.named_modules():
        if name.endswith("self_attn"):
            module.register_forward_pre_hook(_causal_without_mask, with_kwargs=True, prepend=True)


def _causal_without_mask(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    del module
    if "attention_mask" in kwargs:
        kwargs["attention_mask"] = None
        kwargs["is_causal"] = True
    return args, kwargs


@contextlib.contextmanager
def context_parallel_block(
    mesh: Any,
    strategy: str,
    buffers: list[torch.Tensor] | None,
    buffer_seq_dims: list[int] | None,
    no_restore_buffers: set[torch.Tensor] | None,
) -> Iterator[None]:
    """Inside the block, ``buffers`` are cut along their sequence dimension
    (``buffer_seq_dims``) over the ranks of ``mesh`` (the ``cp`` dimension) and attention runs
    as a ring passing keys and values (``strategy``: ``"allgather"`` or ``"alltoall"``); the
    buffers are whole again after it, but ``no_restore_buffers``."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(strategy)
    with context_parallel(
        mesh,
        buffers=buffers,
        buffer_seq_dims=buffer_seq_dims,
        no_restore_buffers=no_restore_buffers,
    ):
        yield
