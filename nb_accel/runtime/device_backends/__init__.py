"""Device backends: what collectives, random numbers, loaders, optimizer steps and checkpoints
ask of the devices a worker runs on (torch.distributed by default, torch_xla in an XLA launch).

:mod:`.base` holds the interface, :mod:`.torch_distributed` the default implementation, and
:mod:`.choice` picks one for each worker from the environment it is started with.
"""
