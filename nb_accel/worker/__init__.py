"""The worker side of every launch: the process mains, the lifecycle around the user's function,
the channel to the kernel, reporting, prompts and post-mortems, residents, and the transfer of
the kernel's values. The library (:mod:`nb_accel.runtime`) never imports it: where it must reach
the worker it calls the sink the worker installs (:mod:`nb_accel.runtime.sinks`)."""
