"""Where a persistent pool's ranks run, behind one interface (:class:`~.interface.PoolRanks`):
on this machine (:mod:`.local`), or spread over hosts (``launch/hosts/pool_ranks.py``)."""
