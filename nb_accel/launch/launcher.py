"""``notebook_launcher`` and ``debug_launcher``: run a function on N worker processes.

A launch is three steps: the options resolved into one checked spec (:mod:`.resolve`, with the
saved configuration and the environment), the backend that runs such a spec chosen
(:mod:`.backends`: XLA devices, hosts over SSH or SLURM, nodes through torch's elastic agent,
this machine's processes, or one registered since), and the launch run to its outcome.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .backends import launch
from .front_door import entry_point
from .request import LaunchCall, LaunchRequest
from .resolve import resolve_spec
from .views.state_dict_note import show_wrapped_state_dicts

__all__ = ["notebook_launcher", "debug_launcher"]


@entry_point
def notebook_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    *,
    mixed_precision: str | None = None,
    start_method: str | None = None,
    timeout: float | None = None,
    kwargs: Mapping[str, Any] | None = None,
    cpu: bool | None = None,
    prefix_output: bool = True,
    use_port: str | int | None = None,
    master_addr: str | None = None,
    show_progress: bool = True,
    all_ranks_metrics: bool = False,
    num_nodes: int | None = None,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_backend: str | None = None,
    max_restarts: int | None = None,
    rdzv_timeout: float | None = None,
    fsdp: bool | None = None,
    sharding: str | None = None,
    hosts: str | Sequence[str] | None = None,
    ssh_config: str | os.PathLike[str] | None = None,
    remote_python: str | None = None,
    rdzv_conf: Mapping[str, Any] | None = None,
    rdzv_id: str | None = None,
    monitor_interval: float | None = None,
    log_line_prefix_template: str | None = None,
    reuse_workers: bool | None = None,
    parallelism_config: Any = None,
) -> list[Any]:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` worker processes and wait.

    Options left as ``None`` take the saved default configuration
    (:func:`~nb_accel.load_config`, written by ``ConfigWidget`` or ``save_config``), then the
    built-in defaults shown below; arguments given explicitly always win.

    Each worker is one rank of a ``torch.distributed`` process group (gloo on CPU, nccl on
    GPUs, ``cuda:nccl,cpu:gloo`` on GPUs with ``fsdp``) that exists while the function runs.
    The function may be defined in a notebook cell, be a closure or a lambda: it travels to the
    workers by cloudpickle.

    Args:
        function: what every rank runs.
        args: positional arguments, the same for every rank.
        num_processes: number of ranks; defaults to one per visible GPU, or 1 on a CPU.
        mixed_precision: ``"no"`` (built-in default), ``"bf16"`` or ``"fp16"``; what
            ``Accelerator()`` uses inside.
        start_method: ``"fork"`` (the default on Linux), ``"spawn"`` or ``"forkserver"``.
            Left unset on GPUs that forked workers could not use (CUDA already initialised in
            the kernel, e.g. by ``torch.cuda.is_available()`` before ``import nb_accel``), the
            workers start with ``"forkserver"`` and a line says so.
        timeout: seconds a collective may wait for the other ranks before failing (built-in
            default 1800).
        kwargs: keyword arguments for ``function``.
        cpu: run on the CPU (gloo) even when GPUs are present (built-in default False).
        prefix_output: prefix each line a worker prints with its rank (when there is more than
            one rank).
        use_port: with ``master_addr``, Accelerate's way of naming the rendezvous of a
            multi-node launch (``rdzv_endpoint`` is ``master_addr:use_port`` when not given);
            a single-node launch needs no port and ignores it.
        master_addr: see ``use_port``.
        show_progress: show the launch view: in a notebook a widget with a row per rank
            (``nb_accel.tqdm`` bars, stalled and failed ranks marked) and live charts of
            ``accelerator.log`` metrics; elsewhere rank 0's bar and a line per failure on
            stderr.
        all_ranks_metrics: chart every rank's logged metrics, not only rank 0's.
        num_nodes: machines taking part (built-in default 1). With more than one, run the same
            call on every machine, each with its own ``node_rank``: the launch goes through
            torch's elastic agent and its c10d rendezvous (what ``torchrun`` uses); each
            machine runs ``num_processes`` ranks.
        node_rank: this machine's number, 0 to ``num_nodes - 1``; it holds ranks
            ``node_rank * num_processes`` and up, so rank 0 is on node 0.
        rdzv_endpoint: ``"host:port"`` of the rendezvous: node 0's address and a port free
            there and reachable from the other nodes. Node 0 hosts it.
        rdzv_backend: the rendezvous backend; ``"c10d"`` (built-in default). Accelerate's
            ``"static"`` is taken too and means the same here: the nodes are fixed, and each
            node's ranks follow from its ``node_rank``.
        max_restarts: how many times every rank is restarted after a failure before the
            launch fails (built-in default 0), on one machine as on several: torch's elastic
            agent runs the launch and restarts the whole group, each worker reads its attempt
            from ``TORCHELASTIC_RESTART_COUNT``, and the view shows each restart and its
            cause. Not with ``reuse_workers=True`` (ValueError) nor on TPUs (no effect).
        rdzv_timeout: seconds to wait for the rendezvous: reaching node 0, and every node
            joining (built-in default 900); torch's ``read_timeout`` and ``join_timeout``
            (see ``rdzv_conf``).
        fsdp: shard the model across the ranks with FSDP2 (torch's ``fully_shard``; each rank
            holds one shard of the parameters, gradients and optimizer state) instead of
            replicating it with DDP: ``Accelerator()`` inside then shards what ``prepare`` is
            given, as with ``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())``.
            ``None`` takes the saved configuration's ``sharding`` (built-in default False,
            DDP). The launch's title says ``"FSDP, N shards"``. CPUs and GPUs only, not XLA.
            On GPUs the group gets gloo beside NCCL for the plugin's ``cpu_offload``.
            Accelerate's spelling of ``sharding="fsdp2"``.
        sharding: how ``prepare`` spreads models over the ranks, by the strategy's name:
            ``"ddp"`` (every rank holds the whole model), ``"fsdp2"`` (as ``fsdp=True``), or
            a strategy registered with ``register_sharding_strategy``. ``None`` takes
            ``fsdp``, else the saved configuration's ``sharding``; given with ``fsdp``, the two
            must agree (ValueError otherwise).
        hosts: run ``num_processes`` ranks on each of these machines, driven from here: a node
            process is started on each over SSH (the system's ``ssh``, with the user's own
            configuration or ``ssh_config``), or with ``"slurm"`` on each node of the current
            SLURM allocation by ``srun``. Each runs torch's elastic agent; they meet at a c10d
            rendezvous on the first host. The function and its arguments travel over the same
            channel (no shared filesystem is needed), and so does everything the workers
            report. The hosts must have the kernel's Python, torch and nb_accel versions
            (checked first). ``"local"``: this machine only, whatever hosts are saved.
        ssh_config: an OpenSSH client configuration file for ``hosts`` (default: the user's
            own, ``~/.ssh/config``). Both take the saved configuration's when left out (unless
            ``num_nodes``, ``node_rank`` or ``rdzv_endpoint`` is given).
        remote_python: the Python interpreter the ``hosts`` run (default: the kernel's own
            path, as on a cluster whose machines share their software).
        rdzv_conf: more options for torch's rendezvous in a multi-node or ``hosts`` launch
            (``LaunchConfig.rdzv_configs``, e.g. ``{"read_timeout": 120}`` or
            ``{"last_call_timeout": 5}``), set over nb_accel's own. Its ``join_timeout`` is
            ``rdzv_timeout`` by torch's name: given alone it sets the rendezvous timeout (it
            wins over a saved ``rdzv_timeout``); given with ``rdzv_timeout`` the two must agree
            (ValueError otherwise). ``rdzv_timeout`` sets torch's ``join_timeout`` and
            ``read_timeout`` unless ``rdzv_conf`` has them. Keys nb_accel sets from other options
            (``is_host``, ``run_id``, ``endpoint``, ...) are refused, naming the option to use.
            A single-node launch has no rendezvous: a non-empty ``rdzv_conf`` there warns
            (``UserWarning``) that it has no effect.
        rdzv_id: the rendezvous run id (``None`` or Accelerate's ``"none"``: ``"nb_accel"``).
            It must be the same on every node: only nodes with the same id meet (others wait
            until ``rdzv_timeout``). No effect on a single node (a warning says so).
        monitor_interval: seconds between two looks of torch's elastic agent at its workers,
            on every node of a multi-node or ``hosts`` launch (above 0; ``None``: 0.05).
            A single-node launch hears its workers end at once, without polling: a value
            given there has no effect, and a warning says so.
        log_line_prefix_template: the prefix of each line the workers print, in place of
            ``[rank N] ``, as torch's elastic agent takes it: ``${rank}`` (global rank),
            ``${local_rank}`` (rank on its machine) and ``${role_name}`` (``"default_role"``,
            torch's ``elastic_launch`` role) are filled in, e.g. ``"[${role_name}${rank}]:"``
            gives ``[default_role0]:``. Any launch; used even with one rank. Another
            placeholder is a ValueError; with ``prefix_output=False`` too.
        reuse_workers: keep the workers for the next launches (default False). The first such
            launch starts them and leaves them running; a later one of the same shape (ranks,
            hosts, start method, devices, precision, sharding) runs on them at once, with what
            they keep (``nb_accel.resident``, imports, the process group); one of another
            shape replaces them, and a line says so. They are the ``%%distributed`` pool's
            workers; ``nb_accel.stop_workers()`` or ``%distributed stop`` ends them, and they
            end with the kernel.
        parallelism_config: the device mesh the ranks are laid out on: a
            ``ParallelismConfig`` (nb_accel's or Accelerate's) or a dict of its sizes
            (``dp_replicate_size``, ``dp_shard_size``, ``tp_size``, ``cp_size``), whose
            product must be the launch's ranks. ``Accelerator()`` inside builds that mesh
            (``accelerator.torch_device_mesh``), as under ``accelerate launch``; a
            ``dp_shard_size`` above 1 shards with FSDP2. ``None`` takes the saved
            configuration's sizes (built-in default: 1 each, no mesh). The title says
            ``"mesh dp_shard 2 x tp 2"``.

    Returns:
        Each rank's return value, in rank order (tensors moved to the CPU); in a multi-node
        launch, this machine's ranks' values (with ``hosts``, every rank's).

    Raises:
        TypeError, ValueError: bad arguments, before any process starts.
        LaunchError: the kernel's state forbids the launch (e.g. CUDA initialised in the kernel
            and ``start_method="fork"`` given).
        Exception: the worker's own exception, re-raised with its original type, the worker's
            traceback as its cause and the failing rank(s) in a note; ``WorkerError`` when it
            could not be moved to the kernel; ``WorkerDiedError`` when a worker was killed;
            ``CollectiveTimeoutError`` when a collective exceeded ``timeout``.
        KeyboardInterrupt: the kernel was interrupted; every worker is stopped first.
    """
    __tracebackhide__ = True  # IPython and pytest leave this frame out
    call = LaunchCall.checked(function, args, kwargs)
    spec = resolve_spec(LaunchRequest.of(locals()))
    outcome = launch(spec, call)
    if isinstance(outcome, BaseException):
        try:
            raise outcome  # re-raised from the entry point, as the user's (entry_point)
        finally:  # the traceback keeps this frame: no name of it may lead back to the error
            outcome = None  # type: ignore[assignment]
    show_wrapped_state_dicts(outcome, spec.first_rank)
    return outcome


@entry_point
def debug_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int = 2,
    *,
    fsdp: bool | None = None,
) -> list[Any]:
    """Run ``function`` on ``num_processes`` CPU processes (gloo): for tests and debugging.
    ``fsdp`` as for :func:`notebook_launcher` (True: shard with FSDP2 across the processes)."""
    __tracebackhide__ = True  # IPython and pytest leave this frame out
    return notebook_launcher(function, args, num_processes, cpu=True, fsdp=fsdp)
