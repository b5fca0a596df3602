"""Other libraries' private names that nb_accel relies on: each is still there.

:data:`USES` lists every use of another library's private name (an underscore name, a private
module, or a class or module of theirs that nb_accel patches), as the table in
``ARCHITECTURE.md`` ("Other libraries' private names") does, row for row. For each use:

- :func:`test_present` imports the library and finds each name; where the installed version
  lacks one, it fails saying which version, which name, where nb_accel uses it and why. A
  library that is not installed (``torch_xla``, ``clearml`` in most environments) is skipped.
- :func:`test_the_table_names_the_same_uses` reads the table and compares it with :data:`USES`.
- :func:`test_every_private_use_is_listed` reads nb_accel's source (:mod:`ast`) and fails on a
  use of another library's private name that no row names, and
  :func:`test_every_listed_use_is_still_there` on a row whose use is gone.

The last tests check what nb_accel says where an installed version lacks one of the names it
cannot do without (the name taken away with ``monkeypatch``).

Names are written ``module:attribute.chain``; ``Class().name`` is a name set on the class's
instances (looked for in the source of the class and its bases of the same library);
``module`` alone is a private module that must import; ``a | b`` passes with either.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import os
import platform
import re
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nb_accel"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
#: The heading of the table in ``ARCHITECTURE.md``.
TABLE_HEADING = "## Other libraries' private names"


@dataclass(frozen=True)
class Use:
    """One use of another library's private names.

    Attributes:
        library: the library as the table names it (its distribution, or ``Python``).
        names: what nb_accel relies on, ``module:attribute.chain`` each (see the module's
            notes for ``Class().name``, a module alone and ``a | b``).
        users: nb_accel's modules that use them, relative to ``nb_accel/``.
        why: what nb_accel does with them, and what public API lacks it.
        needs_cuda: used only by a torch built with CUDA (skipped on a CPU-only build).
    """

    library: str
    names: tuple[str, ...]
    users: tuple[str, ...]
    why: str
    needs_cuda: bool = False

    @property
    def key(self) -> str:
        """The use's test id: the last two parts of its first name."""
        return ".".join(_shown(self.names[0].split(" | ")[0]).split(".")[-2:])

    @property
    def shown(self) -> set[str]:
        """Its names as the table writes them (``module.attribute.chain``)."""
        return {_shown(name) for spec in self.names for name in spec.split(" | ")}


def _shown(name: str) -> str:
    return name.replace(":", ".").replace("()", "")


#: Private modules of torch's that several names below live in.
_C10D = "torch.distributed.distributed_c10d"
_WRAPPERS = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
_ARGS = "transformers.training_args:TrainingArguments"

USES: tuple[Use, ...] = (
    Use(
        "torch",
        (f"{_C10D}:_World", f"{_C10D}:_world"),
        ("worker/process/rank_group.py",),
        "a forked worker drops the process group it inherited from the kernel without touching "
        "it (destroying it would join threads the fork did not copy); no public call does",
    ),
    Use(
        "torch",
        (
            f"{_C10D}:_get_default_store",
            f"{_C10D}:_get_default_group",
            "torch.distributed:ProcessGroup._get_sequence_number_for_group",
        ),
        ("worker/process/regroup.py", "runtime/groups/remaking.py"),
        "after a failed cell a pool's ranks compare the collectives each issued and rebuild "
        "the group from its store; no public call gives the store or the count",
    ),
    Use(
        "torch",
        (f"{_C10D}:_abort_process_group",),
        ("runtime/groups/remaking.py",),
        "drops a pool rank's queued collectives at once, where destroy_process_group (its "
        "fallback) waits for them",
    ),
    Use(
        "torch",
        (f"{_C10D}:_set_pg_timeout | torch.distributed:ProcessGroup.set_timeout",),
        ("runtime/process_group.py",),
        "gives the running group InitProcessGroupKwargs' timeout on a torch older than "
        "ProcessGroup.set_timeout",
    ),
    Use(
        "torch",
        (
            "torch._C._distributed_c10d:_dump_fr_trace_json",
            "torch._C._distributed_c10d:_dump_nccl_trace_json"
            " | torch._C._distributed_c10d:_dump_fr_trace_json",
        ),
        ("worker/reporting/collective_trail.py",),
        "reads the flight recorders (NCCL's is its own in CUDA builds): the last collective a "
        "stalled or timed-out rank entered; torch has no public reader",
    ),
    Use(
        "torch",
        (
            "torch.distributed.elastic.rendezvous.dynamic_rendezvous:"
            "DynamicRendezvousHandler._create_tcp_store_server",
        ),
        ("launch/multinode/rendezvous_stores.py",),
        "replaced per handler: the workers' store listens on the node's address only (without "
        "it, on every address, as torch's does)",
    ),
    Use(
        "torch",
        (
            "torch.distributed.elastic.rendezvous.dynamic_rendezvous:_delay",
            "torch.distributed.elastic.rendezvous.dynamic_rendezvous:"
            "DynamicRendezvousHandler()._state_holder",
            "torch.distributed.elastic.rendezvous.dynamic_rendezvous:"
            "_BackendRendezvousStateHolder()._cache_duration",
        ),
        ("launch/multinode/rendezvous_pace.py",),
        "scaled to the number of nodes while an agent runs: torch's rendezvous waits a second "
        "between two looks at its state (and serves a look from a second-old cache), paced for "
        "thousands of nodes, with no setting; without them, torch's pace",
    ),
    Use(
        "torch",
        ("torch.distributed.tensor._redistribute:logger",),
        ("runtime/parallelism/tensor.py",),
        "held at ERROR while nb_accel makes 2-D tensor parallel DTensors whole (a gradient "
        "norm, whole weights): its advice to flatten the mesh is about Accelerate's layout, "
        "not the user's code; torch offers no switch for it",
    ),
    Use(
        "torch",
        ("torch.distributed.tensor.experimental._attention:set_rotate_method",),
        ("runtime/parallelism/context.py",),
        "sets how context parallel attention passes keys and values around the ranks "
        "(TorchContextParallelConfig's cp_comm_strategy); torch has no public setter",
    ),
    Use(
        "torch",
        ("torch.distributed.device_mesh:DeviceMesh._flatten",),
        ("runtime/parallelism/config.py",),
        "joins dimensions of a ParallelismConfig's mesh into the dp, dp_shard_cp and dp_cp "
        "dimensions Accelerate's mesh has; torch has no public call for it",
    ),
    Use(
        "torch",
        ("torch.distributed.elastic.agent.server.api:SimpleElasticAgent._rendezvous",),
        ("launch/multinode/elastic_agent.py",),
        "overridden: the nodes meet after each rendezvous; the agent has no public hook there",
    ),
    Use(
        "torch",
        (
            "torch.distributed.elastic.agent.server.local_elastic_agent:LocalElasticAgent._shutdown",
            "torch.distributed.elastic.agent.server.api:SimpleElasticAgent._exit_barrier",
        ),
        ("launch/multinode/elastic_agent.py",),
        "overridden: the agent's workers are stopped as every launch stops its ranks before "
        "torch's own stop, whose grace is 30 s (its arguments, to which torch 2.13 adds a "
        "timeout, pass through); a host's node told to stop while it waits at the exit barrier "
        "for the other hosts ends at once",
    ),
    Use(
        "torch",
        (
            "torch.distributed.elastic.agent.server.local_elastic_agent:"
            "LocalElasticAgent._start_workers",
        ),
        ("launch/multinode/elastic_agent.py",),
        "overridden: a start of the workers that did not finish (the kernel's interrupt "
        "between two workers' starts) stops and reaps the workers it started, which torch's "
        "agent keeps only once every one has started; the agent has no public hook there",
    ),
    Use(
        "torch",
        (
            "torch.distributed.elastic.agent.server.api:SimpleElasticAgent._invoke_run",
            "torch.distributed.elastic.utils.store:_barrier_nonblocking",
            "torch.distributed.elastic.agent.server.api:_TERMINAL_STATE_SYNC_ID",
            "torch.distributed.elastic.agent.server.api:SimpleElasticAgent()._store",
        ),
        ("launch/multinode/elastic_agent.py", "launch/multinode/exit_barrier.py"),
        "a node whose run failed checks in at the exit barrier as it leaves: torch's agent "
        "waits there only after a success, and the nodes whose ranks succeeded would wait "
        "for it the barrier's whole timeout; torch has no public call to check in",
    ),
    Use(
        "torch",
        (
            "torch.distributed.elastic.agent.server.api:SimpleElasticAgent._restart_workers",
            "torch.distributed.elastic.agent.server.api:SimpleElasticAgent._monitor_workers",
            "torch.distributed.elastic.agent.server.api:SimpleElasticAgent()._remaining_restarts",
        ),
        ("launch/multinode/elastic_agent.py",),
        "overridden: the kernel hears of each restart of the workers (max_restarts), which "
        "restart it is and which workers' deaths caused it; where each node's kernel sees only "
        "its own workers, a worker killed by a signal is recorded for the other nodes' ranks, "
        "and a node whose workers still run when another node closed the rendezvous stops "
        "them; the agent has no public hook there",
    ),
    Use(
        "torch",
        (
            f"{_WRAPPERS}:checkpoint_wrapper",
            f"{_WRAPPERS}:offload_wrapper",
            f"{_WRAPPERS}:CheckpointWrapper",
            f"{_WRAPPERS}:OffloadWrapper",
            f"{_WRAPPERS}:CheckpointWrapper()._checkpoint_wrapped_module",
        ),
        ("runtime/fsdp/activations.py",),
        "activation checkpointing of FSDP units and its CPU offload: torch keeps these "
        "wrappers in a private module",
    ),
    Use(
        "torch",
        ("torch.cuda:_lazy_init",),
        ("runtime/cuda_origin.py",),
        "wrapped to record the line that first initialised CUDA in the kernel; torch has no "
        "hook (without it the line is not named)",
    ),
    Use(
        "torch",
        ("torch.cuda:_is_in_bad_fork",),
        ("runtime/device_types/cuda_fork.py",),
        "the forked probe tells a kernel that initialised CUDA from one that did not",
    ),
    Use(
        "torch",
        ("torch._C:_cuda_getDeviceCount",),
        ("runtime/device_types/cuda_fork.py",),
        "the forked probe counts the GPUs without torch.cuda's cached count",
        needs_cuda=True,
    ),
    Use(
        "torch",
        ("torch.cuda:_device_count_nvml",),
        ("runtime/device_types/cuda_facts.py",),
        "counts the GPUs through NVML without initialising CUDA (without it, a forked probe "
        "counts them)",
    ),
    Use(
        "torch",
        (
            "torch._dynamo.eval_frame:OptimizedModule",
            "torch._dynamo.eval_frame:OptimizedModule()._orig_mod",
            "torch._dynamo.eval_frame:OptimizedModule().dynamo_ctx",
        ),
        (
            "runtime/training/compile.py",
            "runtime/training/model.py",
            "runtime/sharding/ddp.py",
            "runtime/sharding/fsdp2.py",
        ),
        "tells torch.compile's wrapper and reaches the module inside it (unwrap_model, "
        "find_ddp); torch has no public class for it",
    ),
    Use(
        "torch",
        (
            "torch.nn:Module()._parameters",
            "torch.nn:Module()._buffers",
            "torch.nn:Module()._modules",
        ),
        ("runtime/training/compile.py", "runtime/checkpoint/model_io.py"),
        "a shallow copy of a module with compiled children; a tensor swapped wherever it is "
        "registered (register_parameter refuses a name in use)",
    ),
    Use(
        "torch",
        ("torch.utils.data:DataLoader._index_sampler",),
        ("runtime/data/loader_dispatch.py",),
        "overridden: torch's iterator reads a dispatcher's steps of several batches there",
    ),
    Use(
        "torch",
        ("torch.utils.data.dataloader:_BaseDataLoaderIter._next_index",),
        ("runtime/data/loader_pieces.py",),
        "a dispatcher draws each step's indices from the loader's own iterator (its seed as "
        "when iterated), then collates every process's piece",
    ),
    Use(
        "torch",
        ("torch.utils.data:RandomSampler()._num_samples",),
        ("runtime/data/loaders.py",),
        "a seedable copy of a RandomSampler keeps num_samples as given (the public property "
        "fills in the dataset's length)",
    ),
    Use(
        "torch",
        ("torch.optim.lr_scheduler:LRScheduler()._step_count",),
        ("runtime/training/scheduler.py",),
        "counts a step skipped while gradients accumulate, as Accelerate does (adjust_scheduler)",
    ),
    Use(
        "torch",
        ("torch:TypedStorage()._untyped_storage",),
        ("worker/process/returns.py", "worker/transfer/pickling.py"),
        "a tensor's storage pickled as its bytes; the public untyped() warns that TypedStorage "
        "is deprecated",
    ),
    Use(
        "Python",
        (
            "multiprocessing.forkserver:_forkserver",
            "multiprocessing.forkserver:_forkserver._stop",
            "multiprocessing.forkserver:_forkserver._forkserver_pid",
            "multiprocessing.forkserver:_forkserver._preload_modules",
            "multiprocessing.resource_tracker:_resource_tracker",
            "multiprocessing.resource_tracker:_resource_tracker._stop",
            "multiprocessing.resource_tracker:_resource_tracker._pid",
        ),
        ("launch/processes.py",),
        "the forkserver preloads nb_accel, and it and the resource tracker stop after a launch "
        "that started them (without these, both run as multiprocessing runs them)",
    ),
    Use(
        "Python",
        ("atexit:_run_exitfuncs",),
        ("launch/hosts/remote_node.py",),
        "a host's node process runs its exit functions, then ends without tearing its modules "
        "down (torch's take a third of a second, which every launch on hosts waited for); "
        "Python has no public call that runs them; without it, a plain exit",
    ),
    Use(
        "Python",
        ("argparse:ArgumentParser()._actions",),
        ("notebook/magic_flags.py",),
        "writes an option back as its %%distributed flag, and names the flag a misspelled one "
        "meant; argparse lists its actions nowhere "
        "public",
    ),
    Use(
        "numpy",
        ("numpy._core.multiarray:_reconstruct | numpy.core.multiarray:_reconstruct",),
        ("runtime/checkpoint/methods.py",),
        "allowed in torch.load(weights_only=True), which rebuilds NumPy arrays through it",
    ),
    Use(
        "torch",
        ("torch.distributed:breakpoint",),
        ("worker/debugging/breakpoints.py",),
        "replaced in a worker whose kernel answers prompts: torch's reads the terminal's stdin, "
        "which a notebook's worker has not; ours asks in the notebook, same arguments",
    ),
    Use(
        "Python",
        ("pdb:set_trace",),
        ("worker/debugging/breakpoints.py",),
        "replaced in a worker whose kernel answers prompts: the debugger's prompt is the "
        "notebook's (sys.breakpointhook covers breakpoint(); pdb.set_trace has no hook)",
    ),
    Use(
        "Python",
        ("sys:_current_frames",),
        ("worker/debugging/deadline.py",),
        "the stack of the rank's thread that waits in a collective past the launch's timeout, "
        "for its error, and whether that thread waits inside torch.distributed's send or recv "
        "(gloo's flight recorder leaves them out); the deadline is kept on another thread; "
        "Python has no public reader",
    ),
    Use(
        "tqdm",
        (
            "tqdm.std:tqdm.__new__",
            "tqdm.std:tqdm.__init__",
            "tqdm.std:tqdm.display",
            "tqdm.std:tqdm.close",
            "tqdm.std:tqdm.format_dict",
        ),
        ("worker/reporting/foreign_bars.py",),
        "patched class-wide in a worker: every tqdm bar hands its format_dict to the launch "
        "view instead of drawing",
    ),
    Use(
        "tqdm",
        ("tqdm.notebook:tqdm_notebook.display", "tqdm.notebook:tqdm_notebook.close"),
        ("worker/reporting/foreign_bars.py",),
        "its own methods deleted in a worker, so that notebook bars (tqdm.auto's in a kernel) "
        "work, and report, as text bars",
    ),
    Use(
        "transformers",
        (f"{_ARGS}._setup_devices", f"{_ARGS}()._n_gpu"),
        ("worker/process/trainer_support.py",),
        "TrainingArguments made in the kernel forget its device setup (a `__setstate__` given "
        "to the class) and set up again in the worker; there is no public reset",
    ),
    Use(
        "transformers",
        (
            "transformers.trainer:DEFAULT_CALLBACKS",
            "transformers.trainer:DEFAULT_PROGRESS_CALLBACK",
            "transformers.trainer_callback:ProgressCallback",
        ),
        ("worker/process/trainer_support.py",),
        "patched module-wide in a worker: a callback charts the Trainer's logs, and tqdm's "
        "progress takes the notebook's place",
    ),
    Use(
        "transformers",
        ("transformers:PreTrainedModel._no_split_modules",),
        ("runtime/fsdp/wrap_policy.py",),
        "FSDP's default units: the layers a Transformers model says must not be split",
    ),
    Use(
        "clearml",
        ("clearml:Task._report_subprocess_enabled",),
        ("runtime/tracking/hosted_trackers.py",),
        "turned off: a worker's task reports from its threads, not from a forked process that "
        "can hang closing the task",
    ),
    Use(
        "torch_xla",
        ("torch_xla:_XLAC._xla_runtime_is_initialized",),
        ("runtime/xla/device_type.py",),
        "whether the kernel uses its XLA device itself, which forked workers then cannot",
    ),
    Use(
        "torch_xla",
        ("torch_xla._internal.tpu:version", "torch_xla._internal.tpu:num_local_processes"),
        ("runtime/xla/tpu_plan.py",),
        "the TPU's generation and processes per host, read as xmp.spawn reads them, before "
        "the runtime starts",
    ),
    Use(
        "accelerate",
        (
            "accelerate.state:PartialState._shared_state",
            "accelerate.state:AcceleratorState._shared_state",
            "accelerate.state:GradientState._shared_state",
        ),
        ("worker/process/accelerate_env.py",),
        "cleared in a forked worker, so that Accelerate's next state is the worker's, not the "
        "kernel's",
    ),
    Use(
        "IPython",
        ("IPython.core.interactiveshell:InteractiveShell._showtraceback",),
        ("notebook/tracebacks.py",),
        "shows a cell's syntax error as IPython shows its own, from lines already formatted",
    ),
    Use(
        "torchdata",
        ("torchdata.stateful_dataloader:StatefulDataLoader()._iterator",),
        ("runtime/data/stateful.py",),
        "whether a stateful loader has started iterating: asking its state then starts no "
        "loader workers",
    ),
    Use(
        "cloudpickle",
        ("cloudpickle.cloudpickle:_find_imported_submodules",),
        ("worker/transfer/submodules.py",),
        "wrapped by a memo: cloudpickle reads all of sys.modules for every function it pickles "
        "by value (3.6 ms in a kernel that imported torch, most of a warm command's cost), and "
        "the answer holds while sys.modules keeps its names; cloudpickle has no public hook; "
        "without it, cloudpickle searches every time",
    ),
)


# ---------------------------------------------------------------------------------------------
# Each name is there


def _version(library: str) -> str:
    if library == "Python":
        return platform.python_version()
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _in_source(owner: type, name: str) -> bool:
    """Whether ``name`` is set on instances of ``owner``: assigned as an attribute, or named
    as a string, in the source of ``owner`` or a base class of the same library."""
    top = owner.__module__.split(".")[0]
    pattern = re.compile(rf"\.{re.escape(name)}\s*[:=]|[\"']{re.escape(name)}[\"']")
    for klass in owner.__mro__:
        if klass.__module__.split(".")[0] != top:
            continue
        try:
            if pattern.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):
            continue
    return False


def _find(spec: str) -> bool:
    """Whether one name (``module:chain``, ``module:Class().name`` or a module) is there."""
    module_name, _, chain = spec.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError:
        return False
    parts = chain.split(".") if chain else []
    for index, part in enumerate(parts):
        if part.endswith("()"):
            owner = getattr(found, part[:-2], None)
            rest = parts[index + 1 :]
            return isinstance(owner, type) and len(rest) == 1 and _in_source(owner, rest[0])
        if not hasattr(found, part):
            return False
        found = getattr(found, part)
    return True


def _present(spec: str) -> bool:
    return any(_find(name) for name in spec.split(" | "))


def _missing_message(use: Use, spec: str) -> str:
    names = " or ".join(_shown(name) for name in spec.split(" | "))
    where = ", ".join(f"nb_accel/{user}" for user in use.users)
    return (
        f"{use.library} {_version(use.library)} has no {names}, which nb_accel uses in {where}: "
        f"{use.why}"
    )


def _library_installed(spec: str) -> bool:
    return importlib.util.find_spec(spec.split(":")[0].split(".")[0]) is not None


@pytest.mark.parametrize("use", USES, ids=[use.key for use in USES])
def test_present(use: Use, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each name of ``use`` is there in the installed version of its library."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # set by dynamo
    if not _library_installed(use.names[0]):
        pytest.skip(f"{use.library} is not installed")
    if use.needs_cuda:
        import torch

        if not torch.backends.cuda.is_built():
            pytest.skip("this torch is built without CUDA")
    before = dict(os.environ)
    try:
        missing = [_missing_message(use, spec) for spec in use.names if not _present(spec)]
    finally:  # importing a library can set variables of its own (torch_xla does): not a leak here
        os.environ.clear()
        os.environ.update(before)
    assert not missing, "\n".join(missing)


def test_the_keys_are_unique() -> None:
    """Each row has its own test id (the table's guard column names it)."""
    keys = [use.key for use in USES]
    assert len(keys) == len(set(keys)), keys


def test_tqdm_patches_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the class-wide patches of tqdm take for granted: ``file`` is ``__init__``'s fifth
    argument, ``display(msg, pos)``, the ``format_dict`` fields a bar's state is made of, and
    the notebook bar's widget methods in its own class (deleted, tqdm's text methods show)."""
    from tqdm.notebook import tqdm_notebook
    from tqdm.std import tqdm as std_tqdm

    from nb_accel.worker.reporting import foreign_bars

    monkeypatch.setattr(std_tqdm, "monitor_interval", 0)  # no monitor thread for the bar below
    version = _version("tqdm")
    arguments = list(inspect.signature(std_tqdm.__init__).parameters)[1:]
    assert arguments[foreign_bars._FILE_POSITION] == "file", (
        f"tqdm {version}'s tqdm.__init__ takes {arguments[:6]}: nb_accel/worker/reporting/"
        "foreign_bars.py replaces the file passed fifth by position"
    )
    assert list(inspect.signature(std_tqdm.display).parameters)[1:3] == ["msg", "pos"], (
        f"tqdm {version}'s tqdm.display does not take (msg, pos): nb_accel/worker/reporting/"
        "foreign_bars.py wraps it"
    )
    with std_tqdm(total=3, file=io.StringIO(), desc="d", leave=False) as bar:
        bar.update(1)
        fields = set(bar.format_dict)
        assert {"pos", "leave", "disable"} <= set(vars(bar)), (
            f"tqdm {version}'s bars lack pos, leave or disable, which nb_accel/runtime/"
            "reporting/progress.py reads"
        )
    needed = {"n", "total", "elapsed", "prefix", "unit", "rate", "postfix", "unit_scale"}
    needed |= {"unit_divisor", "bar_format", "initial", "ascii"}
    assert needed <= fields, (
        f"tqdm {version}'s format_dict lacks {sorted(needed - fields)}: nb_accel/runtime/"
        "reporting/progress.py makes a bar's state of them"
    )
    own = set(vars(tqdm_notebook))
    assert {"__init__", "display", "close"} <= own, (
        f"tqdm {version}'s tqdm_notebook defines {sorted(own & {'__init__', 'display', 'close'})}"
        " of its own __init__, display and close, which nb_accel/worker/reporting/"
        "foreign_bars.py deletes to make its bars text bars"
    )


def test_training_arguments_cache_their_device_setup() -> None:
    """``TrainingArguments._setup_devices`` is a cached property: the setup a worker forgets is
    the entry it leaves in the arguments' ``__dict__``."""
    pytest.importorskip("transformers")
    from transformers.training_args import TrainingArguments

    setup = inspect.getattr_static(TrainingArguments, "_setup_devices", None)
    assert isinstance(setup, functools.cached_property), (
        f"transformers {_version('transformers')}'s TrainingArguments._setup_devices is "
        f"{type(setup).__name__}, not a cached property: nb_accel/worker/process/"
        "trainer_support.py forgets the kernel's device setup by its cached entry"
    )


# ---------------------------------------------------------------------------------------------
# The table in ARCHITECTURE.md


@dataclass(frozen=True)
class Row:
    """A row of the table: its cells, with the code spans of the name, user and guard cells."""

    library: str
    names: set[str]
    users: set[str]
    why: str
    guards: set[str]


def _code(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def _table_rows() -> list[Row]:
    text = ARCHITECTURE.read_text()
    assert TABLE_HEADING in text, f"ARCHITECTURE.md has no section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    rows = []
    for line in lines[2:]:  # the header and the line under it
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"a row of the table has {len(cells)} cells: {line}"
        library, names, users, why, guards = cells
        rows.append(Row(library, _code(names), _code(users), " ".join(why.split()), _code(guards)))
    return rows


def _test_names() -> set[str]:
    return {name for name in globals() if name.startswith("test_")}


def test_the_table_names_the_same_uses() -> None:
    """``ARCHITECTURE.md``'s table and :data:`USES` list the same uses, in the same order, with
    the same libraries, names, modules and reasons; each row names tests of this module."""
    rows = _table_rows()
    shown = [sorted(row.names) for row in rows]
    listed = [sorted(use.shown) for use in USES]
    assert shown == listed, (
        "the table's names differ from USES':\n"
        f"only in the table: {[n for n in shown if n not in listed]}\n"
        f"only in USES: {[n for n in listed if n not in shown]}"
    )
    for row, use in zip(rows, USES, strict=True):
        assert row.library == use.library, (row.library, use.key)
        assert row.users == set(use.users), (row.users, use.key)
        assert row.why == " ".join(use.why.split()), (row.why, use.why)
        assert f"test_present[{use.key}]" in row.guards, (use.key, row.guards)
        unknown = {g.split("[")[0] for g in row.guards} - _test_names()
        assert not unknown, f"the row of {use.key} names tests this module lacks: {unknown}"


# ---------------------------------------------------------------------------------------------
# Every use is listed, and every listed use is there

#: Underscore names that are public conventions of Python, IPython and the enum and ctypes
#: modules: ``os._exit``, ``sys._getframe``, a named tuple's ``_replace``...
CONVENTIONS = frozenset(
    {
        "_exit",
        "_getframe",
        "_replace",
        "_fields",
        "_asdict",
        "_make",
        "_field_defaults",
        "_fields_",
        "_render_traceback_",
        "_repr_html_",
        "_ipython_display_",
    }
)
#: Modules whose attributes nb_accel may set as Python means them to be set
#: (``sys.stdout``, ``builtins.input``).
SETTABLE = frozenset({"sys", "builtins", "os"})


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Found:
    """A use the scan found: where, the private name (or ``*``: one not written out), the
    library path it was reached through when known, and how."""

    module: str
    line: int
    name: str
    path: str
    how: str

    def __str__(self) -> str:
        return f"nb_accel/{self.module}:{self.line}: {self.how} {self.path or self.name}"


def _chain(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _external_names(tree: ast.AST) -> tuple[dict[str, str], set[str]]:
    """The names a module binds to other libraries' modules or objects (name: dotted path),
    and those it binds to nb_accel's."""
    external: dict[str, str] = {}
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                path = alias.name if alias.asname else bound
                (own.add(bound) if path.startswith("nb_accel") else external.update({bound: path}))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                bound = alias.asname or alias.name
                if node.level or (node.module or "").startswith("nb_accel"):
                    own.add(bound)
                else:
                    external[bound] = f"{node.module}.{alias.name}"
    return external, own


@functools.cache
def _trees() -> dict[str, ast.Module]:
    return {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


@functools.cache
def _own_attributes() -> frozenset[str]:
    """Underscore attributes nb_accel defines itself: names of its class bodies, attributes it
    sets on ``self`` or ``cls``, and those it keeps in an object's ``__dict__``."""
    names: set[str] = set()
    for tree in _trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(item.name)
                    targets = item.targets if isinstance(item, ast.Assign) else []
                    if isinstance(item, ast.AnnAssign):
                        targets = [item.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.Call) and _reads_dict(node):
                names.add(str(node.args[0].value))  # type: ignore[attr-defined]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(_own_targets(targets))
    return frozenset(names)


def _own_targets(targets: list[ast.expr]) -> Iterator[str]:
    """What assignments to ``self.name``, ``cls.name`` and ``x.__dict__["name"]`` define."""
    for target in _flat(targets):
        chain = _chain(target) if isinstance(target, ast.Attribute) else None
        if chain and len(chain) == 2 and chain[0] in ("self", "cls"):
            yield chain[1]
        if (
            isinstance(target, ast.Subscript)
            and isinstance(target.slice, ast.Constant)
            and isinstance(target.value, ast.Attribute)
            and target.value.attr == "__dict__"
        ):
            yield str(target.slice.value)


def _reads_dict(node: ast.Call) -> bool:
    """``x.__dict__.get("name")`` (or ``pop``, ``setdefault``): an attribute of nb_accel's own
    that it keeps in an object's ``__dict__``."""
    called = node.func
    return (
        isinstance(called, ast.Attribute)
        and isinstance(called.value, ast.Attribute)
        and called.value.attr == "__dict__"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _flat(targets: list[ast.expr]) -> Iterator[ast.expr]:
    """Assignment targets, those inside tuples and lists too (``a.x, a.y = ...``)."""
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            yield from _flat(target.elts)
        else:
            yield target


@functools.cache
def _overridden() -> frozenset[str]:
    """Underscore methods defined in exactly one of nb_accel's classes."""
    counts: dict[str, int] = {}
    for tree in _trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        counts[item.name] = counts.get(item.name, 0) + 1
    return frozenset(name for name, count in counts.items() if count == 1 and _is_private(name))


def _private_parts(path: str) -> list[str]:
    return [part for part in path.split(".") if _is_private(part)]


def _scan(module: str, tree: ast.Module, libraries: frozenset[str]) -> Iterator[Found]:
    """The uses of other libraries' private names in one of nb_accel's modules."""
    external, own_modules = _external_names(tree)
    own_attributes = _own_attributes()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.startswith("nb_accel"):
                continue
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                for part in _private_parts(path):
                    yield Found(module, line, part, path, "imports")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                for part in _private_parts(alias.name):
                    yield Found(module, line, part, alias.name, "imports")
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in external:
                path = ".".join([external[chain[0]], *chain[1:]])
                for part in _private_parts(".".join(chain[1:])):
                    if part not in CONVENTIONS:
                        yield Found(module, line, part, path, "reaches")
                if isinstance(node.ctx, ast.Store) and chain[0] not in SETTABLE:
                    yield Found(module, line, node.attr, path, "patches")
            elif chain and chain[0] in own_modules:
                continue  # one of nb_accel's own modules or names
            elif isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == (
                "super"
            ):
                if node.attr in _overridden():
                    yield Found(module, line, node.attr, "", "overrides a base class's")
            elif (
                _is_private(node.attr)
                and node.attr not in own_attributes
                and node.attr not in CONVENTIONS
            ):
                yield Found(module, line, node.attr, "", "reaches another library's")
        elif isinstance(node, ast.Call):
            yield from _scan_call(module, node, external)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", text) and text.split(".")[0] in libraries:
                for part in _private_parts(text):
                    yield Found(module, line, part, text, "names")


def _scan_call(module: str, node: ast.Call, external: dict[str, str]) -> Iterator[Found]:
    """``getattr(x, "_name")`` and its kin; ``setattr`` on another library's module."""
    called = getattr(node.func, "id", "")
    if called not in ("getattr", "hasattr", "setattr", "delattr") or len(node.args) < 2:
        return
    line = node.lineno
    target, name = node.args[0], node.args[1]
    chain = _chain(target)
    root = external.get(chain[0]) if chain else None
    path = ".".join([root, *chain[1:]]) if chain and root else ""
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        text = name.value
        if not _is_private(text) or text in CONVENTIONS:
            return
        if root is not None or text not in _own_attributes():
            yield Found(module, line, text, f"{path}.{text}" if path else "", f"{called}s")
    elif (
        called in ("setattr", "delattr") and root is not None and chain and chain[0] not in SETTABLE
    ):
        yield Found(module, line, "*", f"{path}.*", f"{called}s a computed name on")


def _covers(use: Use, found: Found) -> bool:
    if found.module not in use.users:
        return False
    names = {part for spec in use.shown for part in spec.split(".")}
    if found.name == "*":
        owner = found.path.removesuffix(".*")
        return any(spec.startswith(owner + ".") for spec in use.shown)
    return found.name in names


@functools.cache
def _libraries() -> frozenset[str]:
    """The top-level modules of other libraries that nb_accel imports."""
    tops: set[str] = set()
    for tree in _trees().values():
        external, _ = _external_names(tree)
        tops.update(path.split(".")[0] for path in external.values())
    return frozenset(tops)


def _unlisted(trees: dict[str, ast.Module]) -> list[Found]:
    found = [f for module, tree in trees.items() for f in _scan(module, tree, _libraries())]
    return [f for f in found if not any(_covers(use, f) for use in USES)]


def test_every_private_use_is_listed() -> None:
    """nb_accel's source reaches no other library's private name that :data:`USES` (and the
    table) leave out."""
    unlisted = _unlisted(_trees())
    assert not unlisted, (
        "uses of other libraries' private names without a row in USES and in ARCHITECTURE.md's "
        f"table {TABLE_HEADING!r}:\n" + "\n".join(sorted({str(f) for f in unlisted}))
    )


def test_the_scan_notices_a_new_use() -> None:
    """A module that reaches a private name of torch's, imports from a private module, or
    patches a class of another library is noticed."""
    source = (
        "import torch\n"
        "from tqdm import tqdm\n"
        "from torch.utils.data._utils.collate import default_convert\n"
        "def f():\n"
        "    tqdm.refresh = None\n"
        "    return torch._C._get_tracing_state(), getattr(torch.cuda, '_initialized', None)\n"
    )
    trees = {"scratch.py": ast.parse(source)}
    found = {(f.name, f.how) for f in _unlisted(trees)}
    assert found == {
        ("_utils", "imports"),
        ("_C", "reaches"),
        ("_get_tracing_state", "reaches"),
        ("refresh", "patches"),
        ("_initialized", "getattrs"),
    }, found


@pytest.mark.parametrize("use", USES, ids=[use.key for use in USES])
def test_every_listed_use_is_still_there(use: Use) -> None:
    """Each module a row names still writes one of its private names (a row whose use is gone
    is taken out of the list and the table)."""
    wanted = {spec.split(".")[-1] for spec in use.shown}
    wanted |= {part for spec in use.shown for part in _private_parts(spec)}
    for user in use.users:
        text = (PACKAGE / user).read_text()
        assert any(re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) for word in wanted), (
            f"nb_accel/{user} no longer uses any of {sorted(use.shown)}"
        )


# ---------------------------------------------------------------------------------------------
# What nb_accel says where an installed version lacks a name it needs


def test_a_forked_worker_says_when_torch_has_no_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked worker that inherited a process group, on a torch without ``_World``."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from nb_accel.worker.process import rank_group

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.delattr(c10d, "_World")
    with pytest.raises(RuntimeError) as raised:
        rank_group.forget_inherited_process_group()
    assert str(raised.value).startswith(
        f"torch {torch.__version__} has no torch.distributed.distributed_c10d._World, through "
        "which a forked worker drops the process group it inherited from the kernel: call "
        "torch.distributed.destroy_process_group() in the kernel before the launch"
    )


def test_a_pool_says_when_torch_has_no_default_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's rank releasing its group after a failed cell, on a torch without
    ``_get_default_store``: nothing is aborted, and the message says what to do."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from nb_accel._messages import Release
    from nb_accel.worker.process import regroup

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.delattr(c10d, "_get_default_store")
    with pytest.raises(
        RuntimeError,
        match=r"has no torch\.distributed\.distributed_c10d\."
        r"_get_default_store, with which a pool's ranks rebuild their process "
        r"group after a failed cell: %distributed restart",
    ):
        regroup.release_process_group(Release(cell=1))


def test_the_node_agent_says_when_torch_has_no_rendezvous_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The elastic agent whose rendezvous step nb_accel extends, without that step."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from nb_accel.errors import LaunchError
    from nb_accel.launch.multinode import elastic_agent

    assert elastic_agent._agent_class()._rendezvous is not SimpleElasticAgent._rendezvous
    monkeypatch.delattr(SimpleElasticAgent, "_rendezvous")
    with pytest.raises(LaunchError, match=r"has no SimpleElasticAgent\._rendezvous, after which"):
        elastic_agent._agent_class()


def test_a_dispatcher_says_when_torch_has_no_index_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dispatched loader that joins batches, on a torch whose iterator would not read them."""
    from torch.utils.data import DataLoader

    from nb_accel.runtime.data import loader_dispatch

    class TwoProcesses:
        num_processes = 2

    monkeypatch.setattr(loader_dispatch, "PartialState", TwoProcesses)
    monkeypatch.delattr(DataLoader, "_index_sampler")
    with pytest.raises(RuntimeError, match=r"has no DataLoader\._index_sampler.*split_batches"):
        loader_dispatch.DataLoaderDispatcher(list(range(8)), batch_size=2)


def test_training_arguments_without_a_cached_setup_are_warned_of() -> None:
    """``TrainingArguments`` adapted in a worker: a warning where nothing caches their device
    setup, none where Transformers' does (the adapted classes are copies)."""
    pytest.importorskip("transformers")
    from transformers.training_args import TrainingArguments

    from nb_accel.worker.process import trainer_support

    without = types.SimpleNamespace(TrainingArguments=type("Arguments", (), {}))
    with pytest.warns(UserWarning, match="TrainingArguments keep no _setup_devices"):
        trainer_support._adapt_training_args(without)  # type: ignore[arg-type]
    copy = types.SimpleNamespace(TrainingArguments=type("Copy", (TrainingArguments,), {}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer_support._adapt_training_args(copy)  # type: ignore[arg-type]
    assert "__setstate__" in vars(copy.TrainingArguments)
    assert "__setstate__" not in vars(TrainingArguments)


def test_clearml_says_when_it_has_no_subprocess_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ClearML task started in a worker, with a ClearML whose ``Task`` lacks the switch of
    its forked reporter (a stand-in module), and with one that has it."""
    from nb_accel.runtime.tracking.hosted_trackers import ClearMLTracker

    class Task:
        @staticmethod
        def current_task() -> None:
            return None

        @staticmethod
        def init(**options: Any) -> dict[str, Any]:
            return options

    clearml = types.ModuleType("clearml")
    clearml.Task = Task  # type: ignore[attr-defined]
    clearml.__version__ = "9.9"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "clearml", clearml)
    tracker = ClearMLTracker("run")
    tracker.main_process_only = False
    with pytest.warns(UserWarning, match=r"clearml 9\.9 has no Task\._report_subprocess_enabled"):
        tracker.start()
    assert Task._report_subprocess_enabled is False  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracker.start()  # the switch is there now


def test_forkserver_launches_run_where_multiprocessing_lacks_its_helpers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``forkserver._forkserver`` the helpers are left as multiprocessing runs them."""
    from multiprocessing import forkserver

    from nb_accel.launch.processes import multiprocessing_helpers

    monkeypatch.delattr(forkserver, "_forkserver")
    with multiprocessing_helpers("forkserver"):
        pass


def test_torch_without_its_rendezvous_waits_keeps_its_own_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A torch whose rendezvous does not wait through ``_delay``: its own pace, untouched."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from nb_accel.launch.multinode.rendezvous_pace import brisk_rendezvous

    holder = types.SimpleNamespace(_cache_duration=1)
    monkeypatch.delattr(dynamic_rendezvous, "_delay")
    with brisk_rendezvous(types.SimpleNamespace(_state_holder=holder), 2):
        assert holder._cache_duration == 1
        assert not hasattr(dynamic_rendezvous, "_delay")
