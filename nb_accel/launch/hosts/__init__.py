"""Launches across machines driven from the kernel: a node process on each host, reached over
SSH or started by ``srun``, runs torch's elastic agent there and sends everything back over the
same channel."""
