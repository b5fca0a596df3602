"""Where a launch's ranks run beyond this kernel's own processes: the nodes of a launch run from
several kernels (``nodes.py``), the hosts driven from this one (``hosts.py``) and how each host
is reached, over OpenSSH or SLURM's ``srun`` (``transport.py``). Checked before anything starts;
the launchers that use them are in ``launch/multinode/`` and ``launch/hosts/``."""
