"""Training in the workers: the model, optimizer and scheduler wrappers, gradient
accumulation, mixed precision, and the Accelerator's training-loop methods."""
