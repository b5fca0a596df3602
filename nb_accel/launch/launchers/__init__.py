"""The launcher interface, and what every launcher shares.

A launcher runs one launch's ranks: it starts the worker group with the payload, streams the
workers' events to the shared :class:`~.dispatch.EventDispatcher`, gives the outcome and stops
the group (:class:`~.interface.Launcher`; :func:`~.interface.run_launch` drives one launch).
Written once here: the event dispatch (:mod:`.dispatch`), the outcome (results in rank order, or
the root cause with its knock-on failures: :mod:`.outcome`), the launch's view (:mod:`.view`) and
stopping processes (:mod:`.stopping`).

The launchers: one node (:mod:`nb_accel.launch.single_node`), several nodes through torch's
elastic agent (:mod:`nb_accel.launch.multinode.launcher`), XLA devices
(:mod:`nb_accel.launch.xla.launcher`) and the ``%%distributed`` pool
(:mod:`nb_accel.launch.pool`). ``notebook_launcher`` chooses one from its arguments
(:mod:`nb_accel.launch.launcher`: XLA devices when the kernel runs on a TPU runtime, through
``launch_xla``, which checks the options only XLA has; else ``_launcher()``); another launcher
is one more module implementing the interface and one more branch there.
"""
