"""Fully sharded data parallel training on PyTorch's FSDP2 (``fully_shard``): the plugin, the
wrap policy, sharding a model and moving its optimizer onto the shards, sharded gradients and
state dicts through ``torch.distributed.checkpoint``."""

from .plugin import FullyShardedDataParallelPlugin

__all__ = ["FullyShardedDataParallelPlugin"]
