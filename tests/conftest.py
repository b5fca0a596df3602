"""Suite-wide hygiene: every test must leave no child process, thread or env change behind,
and the test run as a whole leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from nb_accel.runtime.state import reset_all_states

#: The suite never reads or writes a user's saved configuration: launches (and kernels started
#: by tests) look for it in a file that does not exist unless a test writes it. The folder lives
#: from the start of the test run to its end, and the variable stays set all that time.
CONFIG_VARIABLE = "NB_ACCEL_CONFIG_FILE"
#: Outside tests/gpu every launch, kernel and Accelerator runs on the CPU (gloo), also on a
#: machine with GPUs; tests/gpu/conftest.py lifts this for the GPU tests.
CPU_VARIABLE = "NB_ACCEL_USE_CPU"
#: The run's configuration file (it must stay unwritten: every test would launch with it).
_run_config_file = ""
#: The run's configuration folder and both variables' values before the run.
_CONFIG_RUN = pytest.StashKey[tuple[str, dict[str, str | None]]]()


def pytest_configure(config: pytest.Config) -> None:
    """Point the saved configuration at a fresh, empty folder and force the CPU, for the run."""
    folder = tempfile.mkdtemp(prefix="nb_accel-test-config-")
    config.stash[_CONFIG_RUN] = (
        folder,
        {name: os.environ.get(name) for name in (CONFIG_VARIABLE, CPU_VARIABLE)},
    )
    os.environ[CONFIG_VARIABLE] = os.path.join(folder, "default_config.yaml")
    os.environ[CPU_VARIABLE] = "1"
    global _run_config_file  # noqa: PLW0603 - the run's one file, read by no_leftovers
    _run_config_file = os.environ[CONFIG_VARIABLE]
    _import_what_changes_the_environment()
    _interrupts_as_in_a_kernel()


def _interrupts_as_in_a_kernel() -> None:
    """Ctrl-C raises ``KeyboardInterrupt`` in this process, as in a kernel, also when the run
    was started with SIGINT ignored (a shell's background job: Python then leaves it ignored,
    and the tests that interrupt a launch would wait for an interrupt that never comes)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _import_what_changes_the_environment() -> None:
    """Import, before any test, what sets variables in this process's environment when it is
    first imported: jupyter_client reads the kernel's spec from ``ipykernel.kernelspec`` when
    it starts the first kernel, and on ipykernel 6 (Colab's) that imports debugpy, which sets
    ``PYDEVD_USE_FRAME_EVAL`` for good. The change would be blamed on that first test. And
    ``torch._dynamo``, which sets ``TORCHINDUCTOR_CACHE_DIR``: DDP's constructor imports it
    (about 800 modules, 1.2 s of a core), and the ranks this process forks share it instead of
    each importing it on every launch."""
    try:
        import ipykernel.kernelspec  # noqa: F401
    except ImportError:  # no kernel tests without ipykernel
        pass
    import torch._dynamo  # noqa: F401


#: ``make test``'s two halves, run at once (``tools/at_once.py``), by ``--suite-half``: the
#: multi-process tests on this machine, and the rest (the kernels', the units', and the tests
#: whose ranks run on other machines: SSH hosts, a SLURM cluster), of about the same time.
OTHER_MACHINES = ("test_hosts_ssh.py", "test_hosts_slurm.py", "test_hosts_pool.py")
SUITE_HALVES = ("processes", "others")


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--suite-half`` option."""
    parser.addoption(
        "--suite-half",
        choices=SUITE_HALVES,
        default=None,
        help="only this half of the suite (make test runs both at once)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the other half's tests when ``--suite-half`` names one."""
    half = config.getoption("--suite-half")
    if half is None:
        return
    kept, dropped = [], []
    for item in items:
        path = item.path
        on_this_machine = path.parent.name == "multiproc" and path.name not in OTHER_MACHINES
        (kept if on_this_machine == (half == "processes") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's configuration folder and restore the variables."""
    if _CONFIG_RUN not in config.stash:
        return
    folder, before = config.stash[_CONFIG_RUN]
    shutil.rmtree(folder, ignore_errors=True)
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


#: How long a test's leftovers get to finish on their own before they count as leaks.
SETTLE_S = 10.0


def _env_snapshot() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def _children() -> dict[int, psutil.Process]:
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def _settle(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


#: Fixtures wider than a test that keep a kernel from one test to the next (the chaos
#: campaign's, one per style), or a cluster whose daemons start processes of their own while a
#: test runs (the Ray lane's, whose kernels run on its head node): a test using one has its
#: leftovers checked by its own invariants (the campaign's after every scenario: the kernel's
#: processes, threads, descriptors; the Ray tests': every process on the cluster's machines),
#: and the kernel's or the cluster's by the fixture once it shuts it down.
KEEPS_A_KERNEL = ("style_kernels", "ray_cluster")


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a child process, a thread or a changed environment behind.

    What a test leaves on the test machines out of its process tree (a SLURM step, an SSH
    session: re-parented away from it) fails it at the machines' teardown, which finds every
    process there by its network namespace (``tests/multiproc/machines.py``)."""
    if any(name in request.fixturenames for name in KEEPS_A_KERNEL):
        yield
        return
    env_before = _env_snapshot()
    children_before = set(_children())
    threads_before = set(threading.enumerate())
    yield
    reset_all_states()  # Accelerator/PartialState made in this process must not leak
    problems: list[str] = []
    new_children = lambda: [p for pid, p in _children().items() if pid not in children_before]  # noqa: E731
    _settle(lambda: not new_children())
    leftover = new_children()
    if leftover:
        problems.append(f"child processes left running: {[(p.pid, p.name()) for p in leftover]}")
        for process in leftover:
            try:
                process.kill()
            except psutil.Error:
                pass
    new_threads = lambda: [  # noqa: E731
        t for t in threading.enumerate() if t not in threads_before and t.is_alive()
    ]
    _settle(lambda: not new_threads())
    if new_threads():
        problems.append(f"threads left running: {[t.name for t in new_threads()]}")
    saved = os.environ.get(CONFIG_VARIABLE)
    if saved and os.path.exists(saved) and saved == _run_config_file:
        os.remove(saved)  # every later test would launch with it
        problems.append(
            "the run's configuration file was written: point NB_ACCEL_CONFIG_FILE at a file in "
            "tmp_path (monkeypatch.setenv) before saving one"
        )
    if _env_snapshot() != env_before:
        changed = sorted(set(_env_snapshot().items()) ^ set(env_before.items()))
        for key in set(_env_snapshot()) - set(env_before):
            del os.environ[key]
        os.environ.update(env_before)
        problems.append(f"environment changed: {changed}")
    if problems:
        pytest.fail("; ".join(problems))
