"""What a worker tells the kernel: the event channel, printed output, progress bars
and metrics."""
