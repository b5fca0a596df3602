"""The one catalogue of the messages that cross nb_accel's processes, a module per channel:

- :mod:`~nb_accel._messages.events`: worker to kernel, the events a worker sends on the
  launch's event channel (:func:`encode`, :func:`decode`);
- :mod:`~nb_accel._messages.commands`: kernel to worker, the commands of a persistent worker
  and the answers to a rank's prompts (:func:`encode_command`, :func:`decode_command`);
- :mod:`~nb_accel._messages.hosts`: kernel and a host's node process, over the ``ssh`` or
  ``srun`` channel (framed by :mod:`nb_accel.launch.hosts.protocol`);
- :mod:`~nb_accel._messages.nodes`: node to node, through the rendezvous store.

Every name is importable from here (``from nb_accel._messages import Started``)."""

from __future__ import annotations

from . import commands, events, hosts, nodes
from .commands import *  # noqa: F403 - the catalogue is the channels' modules together
from .events import *  # noqa: F403
from .hosts import *  # noqa: F403
from .nodes import *  # noqa: F403

__all__ = [*events.__all__, *commands.__all__, *hosts.__all__, *nodes.__all__]
