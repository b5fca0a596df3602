"""Worker side: state, the Accelerator, data sharding, collectives (no IPython here)."""
