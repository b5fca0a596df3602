"""The worker processes' entry points (a launch's, a node's, a pool's), their inputs,
what they may return, and their output forwarding."""
