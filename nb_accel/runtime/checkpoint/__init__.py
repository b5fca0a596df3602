"""Checkpoints: what a state folder holds, its folders' names and pruning, model
weight files, and the Accelerator's save and load methods."""
