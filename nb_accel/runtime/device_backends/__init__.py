"""Device backends: what collectives, random numbers, loaders, optimizer steps and checkpoints
ask of the devices a worker runs on (torch.distributed by default, torch_xla in an XLA launch).

:mod:`.base` holds the interface, :mod:`.torch_distributed` the default implementation, and
:mod:`.choice` picks one for each worker from the environment it is started with. Another
backend is one module implementing :class:`.base.DeviceBackend`, in the folder of the devices
it serves (as ``runtime/xla/backend.py``), declared as an ``nb_accel.device_backends`` entry
point (``pyproject.toml``), or registered with :func:`.choice.register_device_backend`.
"""
