"""``nb_accel.data_loader``: where Accelerate's ``accelerate.data_loader`` names are."""

from .runtime.data.loaders import (
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from .runtime.data.sampling import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "prepare_data_loader",
    "skip_first_batches",
]
