"""Device backends: what collectives, random numbers, loaders, optimizer steps and checkpoints
ask of the devices a worker runs on (torch.distributed by default, torch_xla in an XLA launch).

:mod:`.base` holds the interface, :mod:`.torch_distributed` the default implementation, and
:mod:`.choice` picks one for each worker from the environment it is started with. Another
backend is one module implementing :class:`.base.DeviceBackend`, in the folder of the launch
that starts its workers (as ``runtime/xla/backend.py``), and one
:func:`.choice.register_device_backend` line in that folder's ``__init__``.
"""
