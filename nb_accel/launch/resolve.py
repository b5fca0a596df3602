"""From what was asked to what runs: a :class:`~.request.LaunchRequest` resolved into a
:class:`~.spec.LaunchSpec`, every option left out taken from the saved configuration, then the
built-in defaults; every mistake raised here, before any process starts.

``notebook_launcher``, the ``%%distributed`` pool and its magics resolve through this one
function, so an option means the same wherever it is given.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

from .._keywords import unknown_keywords_error
from ..config import Config, config_path, load_config
from ..errors import LaunchError
from ..runtime.device_types import DeviceType, choose_device_type
from ..runtime.device_types.cpu import CPU_VARIABLE
from ..runtime.sharding import sharding_for_fsdp, sharding_name, strategy_class
from .debugging.post_mortems import in_ipython
from .failures.user_errors import for_the_user, meant_for_the_user
from .placement.hosts import HostPlan, make_host_plan
from .placement.mesh import MeshPlan, make_mesh_plan, mesh_sizes
from .placement.nodes import NODE_FIELDS, NodePlan, make_node_plan
from .plan import make_plan
from .request import LaunchRequest, request_fields
from .spec import LaunchSpec, OutputOptions
from .views.output import check_prefix_template

__all__ = ["resolve_pool_spec", "resolve_spec"]


def resolve_spec(
    request: LaunchRequest, *, pool: bool = False, config: Config | None = None
) -> LaunchSpec:
    """The launch ``request`` asks for, with the saved configuration (``config``, else the
    file's) filling what it leaves out; ``pool``: persistent workers, which run on this
    machine or on hosts, never on nodes of their own kernels.

    Raises:
        TypeError, ValueError: an option that is not valid, naming it.
        LaunchError: the saved configuration or the kernel's state forbids the launch.
    """
    config = load_config() if config is None else config
    output = _output_options(request)
    sizes = mesh_sizes(request.parallelism_config, config)
    sharding = _mesh_sharding(_sharding(request, config), sizes, request)
    cpu = request.cpu
    if cpu is None:  # NB_ACCEL_USE_CPU=1 stands for cpu=True, else the saved setting
        cpu = os.environ.get(CPU_VARIABLE) == "1" or config.cpu
    reuse = _reuse_workers(request, config)
    reuse_asked = request.reuse_workers is not None  # else the saved setting, where it applies
    # persistent workers keep a process group: they run on the devices that have one
    device = choose_device_type(cpu, own_launchers=not (pool or (reuse and reuse_asked)))
    nodes = _nodes(request, config)
    hosts = _hosts(request, config, nodes, device)
    if (
        reuse
        and not reuse_asked
        and (
            device.launcher is not None
            or (hosts is None and nodes.multi_node)
            or request.max_restarts
        )
    ):
        # saved for this kernel's own workers: a TPU or multi-node launch runs cold, and so
        # does one whose workers are restarted after a failure
        reuse = False
    if reuse and hosts is None and nodes.multi_node:
        raise ValueError(
            f"reuse_workers=True keeps workers this kernel drives, but num_nodes={nodes.num_nodes} "
            "runs a kernel on each node: give hosts=[...] to drive every machine from here, or "
            "leave reuse_workers out"
        )
    if pool and hosts is None and nodes.multi_node:
        asked = (
            f"num_nodes={nodes.num_nodes} was given"
            if request.num_nodes is not None
            else f"the saved configuration ({config_path()}) asks for num_nodes={nodes.num_nodes}"
        )
        raise LaunchError(
            f"{asked}, but persistent %%distributed workers run on this machine only (or on "
            "hosts): set num_nodes to 1 for them (notebook_launcher runs on several nodes)"
        )
    if reuse and reuse_asked and request.max_restarts:
        raise ValueError(
            f"max_restarts={nodes.max_restarts} restarts a launch's workers after a failure, but "
            "reuse_workers=True keeps the same workers from launch to launch (a dead one is "
            "replaced before the next launch): give one of the two"
        )
    if hosts is None and not nodes.multi_node and (nodes.max_restarts == 0 or device.launcher):
        _warn_without_agent(device, request)
    _check_sharding_runs_on(sharding, device, request, config)
    # workers that cannot be forked start once, warm, unless the launch says reuse_workers=False
    warm_fallback = (
        not pool
        and request.reuse_workers is not False
        and device.launcher is None
        and hosts is None
        and not nodes.multi_node
        and nodes.max_restarts == 0  # restarted workers are torch's elastic agent's
    )
    plan = make_plan(
        device,
        config.num_processes if request.num_processes is None else request.num_processes,
        config.mixed_precision if request.mixed_precision is None else request.mixed_precision,
        config.start_method if request.start_method is None else request.start_method,
        config.timeout if request.timeout is None else request.timeout,
        config.gradient_accumulation_steps,
        sharding,
        warm_fallback=warm_fallback,
        forked_here=hosts is None,
    )
    if plan.fork_fallback and warm_fallback:
        reuse = True  # one fresh interpreter per rank once, not at every launch
    if not pool and in_ipython():  # the rank that raises waits for %debug
        plan = dataclasses.replace(plan, post_mortem_s=float(config.post_mortem_wait))
    if hosts is not None:  # a Ray cluster's nodes, found for the plan's ranks
        hosts = hosts.found(plan.num_processes, plan.device.cluster_resource)
    spec = LaunchSpec(plan, nodes, hosts, output, request, reuse_workers=reuse)
    mesh = _mesh(sizes, spec.world_size, sharding, device)
    return dataclasses.replace(spec, plan=dataclasses.replace(plan, mesh=mesh))


def _reuse_workers(request: LaunchRequest, config: Config) -> bool:
    """``reuse_workers`` as given, else as saved."""
    value = request.reuse_workers
    if value is None:
        return config.reuse_workers
    if not isinstance(value, bool):
        raise TypeError(f"reuse_workers must be True or False, got {value!r}")
    return value


def _output_options(request: LaunchRequest) -> OutputOptions:
    template = request.log_line_prefix_template
    check_prefix_template(template)
    if template and not request.prefix_output:
        raise ValueError(
            "log_line_prefix_template gives each worker line a prefix, but prefix_output=False "
            "turns prefixes off: leave one of them out"
        )
    return OutputOptions(
        request.prefix_output, template, request.show_progress, request.all_ranks_metrics
    )


def _sharding(request: LaunchRequest, config: Config) -> str:
    """The strategy's registered name: ``sharding``, or Accelerate's ``fsdp`` (True: FSDP2,
    False: data parallel), or the saved one."""
    fsdp = request.fsdp
    if fsdp is not None and not isinstance(fsdp, bool):
        raise TypeError(
            f"fsdp must be True, False or None (the saved configuration's sharding), got "
            f"{fsdp!r} ({type(fsdp).__name__})"
        )
    if request.sharding is None:
        return sharding_for_fsdp(fsdp) if fsdp is not None else sharding_name(config.sharding)
    chosen = sharding_name(request.sharding)
    if fsdp is not None and sharding_for_fsdp(fsdp) != chosen:
        raise ValueError(
            f"sharding={request.sharding!r} and fsdp={fsdp} ask for different strategies: give "
            "only sharding (fsdp=True is Accelerate's way of saying sharding='fsdp2')"
        )
    return chosen


def _mesh_sharding(sharding: str, sizes: dict[str, int], request: LaunchRequest) -> str:
    """FSDP2 when the mesh has FSDP shards (``dp_shard_size`` above 1), as ``Accelerator()``
    turns it on for them; a ``ValueError`` when the launch asked for another strategy."""
    fsdp2 = sharding_for_fsdp(True)
    if sizes["dp_shard_size"] == 1 or sharding == fsdp2:
        return sharding
    if request.sharding is not None or request.fsdp is not None:
        raise ValueError(
            f"parallelism_config has dp_shard_size={sizes['dp_shard_size']}, which shards "
            f"the model with FSDP2, but the launch asks for sharding={sharding!r}: leave "
            "sharding (and fsdp) out, or use dp_replicate_size for replicas"
        )
    return fsdp2


def _mesh(sizes: dict[str, int], world_size: int, sharding: str, device: DeviceType) -> MeshPlan:
    """The launch's device mesh, checked against its ``world_size`` ranks on ``device``."""
    if any(size > 1 for size in sizes.values()) and not device.process_group:
        raise ValueError(
            f"parallelism_config lays the ranks out on a device mesh of torch.distributed "
            f"groups, and the ranks of a launch on {device.label}s join none: leave it out "
            "there, or pass cpu=True"
        )
    return make_mesh_plan(sizes, world_size, sharding == sharding_for_fsdp(True), device)


def _check_sharding_runs_on(
    sharding: str, device: DeviceType, request: LaunchRequest, config: Config
) -> None:
    """A strategy that shards over a process group is refused on devices whose ranks join
    none (XLA's), saying how the launch could run."""
    strategy = strategy_class(sharding)
    if not strategy.needs_process_group or device.process_group:
        return
    if request.fsdp or request.sharding is not None:
        asked = "fsdp=True" if request.fsdp else f"sharding={request.sharding!r}"
    else:
        asked = f"the saved configuration ({config_path()}) has sharding: {config.sharding}"
    raise ValueError(
        f"{asked}, but this launch runs on {device.label}s, whose ranks join no torch.distributed "
        f"process group, and {strategy.label} shards over one (torch's fully_shard, on CPUs and "
        "GPUs). Pass sharding='ddp' (or fsdp=False) to run data parallel there, or cpu=True to "
        f"run {strategy.label} on the CPU"
    )


def _nodes(request: LaunchRequest, config: Config) -> NodePlan:
    """The machines of a launch run from several kernels: each option given, else saved.
    A ``join_timeout`` in ``rdzv_conf`` counts as ``rdzv_timeout`` given."""
    given: dict[str, Any] = {name: getattr(request, name) for name in NODE_FIELDS}
    if _on_ray(request, config):  # how many of the cluster's nodes is the hosts' to say
        given["num_nodes"] = 1
    if given["rdzv_endpoint"] is None and request.master_addr and request.use_port is not None:
        given["rdzv_endpoint"] = f"{request.master_addr}:{request.use_port}"
    conf = request.rdzv_conf
    joined = isinstance(conf, Mapping) and "join_timeout" in conf
    values = [
        value if value is not None or (name == "rdzv_timeout" and joined) else getattr(config, name)
        for name, value in given.items()
    ]
    return make_node_plan(
        *values,
        rdzv_conf=conf,
        rdzv_id=request.rdzv_id,
        monitor_interval=request.monitor_interval,
    )


def _on_ray(request: LaunchRequest, config: Config) -> bool:
    """Whether the launch runs on a Ray cluster's nodes (given, or saved)."""
    return request.hosts == "ray" or (request.hosts is None and config.hosts == "ray")


def _nodes_given(request: LaunchRequest) -> bool:
    return any(
        value is not None for value in (request.num_nodes, request.node_rank, request.rdzv_endpoint)
    )


def _hosts(
    request: LaunchRequest, config: Config, nodes: NodePlan, device: DeviceType
) -> HostPlan | None:
    """The machines driven from this kernel: ``hosts`` given, else the saved ones (unless the
    nodes were given, or the devices need a launch backend of their own, which runs here)."""
    hosts, ssh_config = request.hosts, request.ssh_config
    given_nodes = _nodes_given(request)
    if device.launcher is not None:
        if hosts not in (None, "local") or nodes.multi_node:
            raise ValueError(
                f"a launch on {device.label}s runs on this machine only: leave hosts and "
                "num_nodes out, or pass cpu=True to run on the CPUs of several machines"
            )
        return None
    if hosts is None and not given_nodes:  # the saved hosts, unless nodes were given
        hosts = config.hosts
        ssh_config = config.ssh_config if ssh_config is None else ssh_config
    if hosts is None:
        return None
    given_place = request.node_rank is not None or request.rdzv_endpoint is not None
    num_nodes = request.num_nodes
    if hosts == "ray" and num_nodes is None and request.hosts is None:
        num_nodes = config.num_nodes if config.num_nodes > 1 else None  # saved with the hosts
    return make_host_plan(
        hosts, ssh_config, nodes, given_place, request.remote_python, num_nodes=num_nodes
    )


def _warn_without_agent(device: DeviceType, request: LaunchRequest) -> None:
    """Warn once (a ``UserWarning`` at the caller's line) that the rendezvous options given do
    nothing in a launch on one machine, which runs no rendezvous and no elastic agent."""
    given = [
        name
        for name, used in (
            ("rdzv_conf", bool(request.rdzv_conf)),
            ("rdzv_id", request.rdzv_id not in (None, "none")),
            ("monitor_interval", request.monitor_interval is not None),
            ("max_restarts", bool(request.max_restarts)),
        )
        if used
    ]
    if not given:
        return
    launch = "a single-node launch" if device.launcher is None else f"a launch on {device.label}s"
    names, one = ", ".join(given), len(given) == 1
    warnings.warn(
        f"{names} {'has' if one else 'have'} no effect on {launch}: its workers are started and "
        "watched directly, with no rendezvous and no elastic agent (they apply where torch's "
        "elastic agent runs: num_nodes > 1, hosts, or max_restarts on CPUs and GPUs); leave "
        f"{'it' if one else 'them'} out to silence this warning",
        UserWarning,
        stacklevel=4,
    )


def resolve_pool_spec(num_processes: int | None, options: dict[str, Any]) -> LaunchSpec:
    """A pool's spec from ``WorkerPool``'s options (``notebook_launcher``'s); an unknown or bad
    one raised as the user's error."""
    __tracebackhide__ = True  # IPython and pytest leave this frame out
    try:
        refused = unknown_keywords_error(
            "WorkerPool",
            options,
            request_fields(),
            ending="it takes notebook_launcher's options (see help(notebook_launcher))",
        )
        if refused is not None:
            raise refused
        return resolve_spec(LaunchRequest(num_processes=num_processes, **options), pool=True)
    except BaseException as error:
        if not meant_for_the_user(error):
            raise
        raise for_the_user(error) from error.__cause__
