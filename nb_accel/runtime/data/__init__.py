"""Data in the workers: samplers and sharding, the shard loader, the dispatcher and
its links and wire format, resuming a loader, random number generators."""
