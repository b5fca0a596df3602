"""Experiment trackers: the :class:`~.base.GeneralTracker` interface, one module per tracker
(or a few of one kind), the choice ``log_with`` makes, and the Accelerator's tracker methods.
A tracker's library is imported only when its run starts."""
