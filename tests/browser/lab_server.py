"""A throwaway JupyterLab (or classic Notebook 6) server for the browser tests.

The server listens on 127.0.0.1 only, on a free port, behind a random token. Everything it
would write in a user's home (Jupyter config, data and runtime files, IPython profile, Lab
settings and workspaces, nb_accel's saved configuration) goes to a temporary folder, and the
notebooks it serves are copies, so the ones in the repository are never autosaved with outputs.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
from ports import free_port

#: How long the server gets to answer its status page after it is started.
START_TIMEOUT_S = 90.0
#: How long the server gets to exit after it is asked to shut down.
STOP_TIMEOUT_S = 20.0
#: Runs the server (its module and program name follow the parent's pid) in a process that
#: Linux sends SIGTERM when the test process ends (prctl's PR_SET_PDEATHSIG), so that even a
#: test run that is killed leaves no server or kernel behind.
BOOTSTRAP = """
import ctypes, os, runpy, signal, sys
parent = int(sys.argv.pop(1))
module, sys.argv[0] = sys.argv.pop(1), sys.argv.pop(1)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit("the test process is gone")
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
#: The classic Notebook 6 (Colab's front end's stack): its module, program and server class.
CLASSIC = ("notebook", "jupyter-notebook", "NotebookApp")
#: JupyterLab: its module, program and server class.
LAB = ("jupyterlab", "jupyter-lab", "ServerApp")
#: Lab settings for a quiet test session: no news or update toasts.
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def isolated_env(home: Path) -> dict[str, str]:
    """This process's environment with every per-user location moved under ``home``."""
    env = dict(os.environ)
    places = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_DATA_HOME": home / ".local" / "share",
        "JUPYTER_CONFIG_DIR": home / "jupyter-config",
        "JUPYTER_DATA_DIR": home / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": home / "jupyter-runtime",
        "IPYTHONDIR": home / "ipython",
        "NB_ACCEL_CONFIG_FILE": home / "nb_accel" / "default_config.yaml",
    }
    for name, place in places.items():
        if name != "NB_ACCEL_CONFIG_FILE":
            place.mkdir(parents=True, exist_ok=True)
        env[name] = str(place)
    env.pop("JUPYTERLAB_SETTINGS_DIR", None)
    env.pop("JUPYTERLAB_WORKSPACES_DIR", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class LabServer:
    """A running JupyterLab: its URL, token, served folder, process and log file."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    def lab_url(self) -> str:
        """The address of JupyterLab's page (the token logs the browser in)."""
        return f"{self.url}/lab?token={self.token}"

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Call the server's REST API; the decoded JSON answer, or ``None`` when it is empty."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def log_text(self) -> str:
        """What the server has written to its log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kernel_ids(self) -> list[str]:
        """The ids of the kernels the server runs."""
        return [kernel["id"] for kernel in self.api("GET", "/api/kernels")]

    def wait_for_idle_kernel(self, path: str, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until the notebook at ``path`` has a started kernel that is idle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for session in self.api("GET", "/api/sessions"):
                kernel = session.get("kernel") or {}
                if session.get("path") == path and kernel.get("execution_state") == "idle":
                    return
            time.sleep(0.2)
        raise TimeoutError(f"no idle kernel for {path} after {timeout} s:\n{self.log_text()}")

    def shutdown_kernels(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Shut every kernel down and wait until their processes are gone."""
        before = _descendants(self.process.pid)
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}", timeout=timeout)
        for kernel_id in self.kernel_ids():
            self.api("DELETE", f"/api/kernels/{kernel_id}", timeout=timeout)
        _reap(before, timeout)

    def stop(self) -> None:
        """Shut the server down (kernels included); kill whatever is left of it."""
        family = [*_descendants(self.process.pid), _process(self.process.pid)]
        if self.process.poll() is None:
            try:
                self.api("POST", "/api/shutdown", timeout=STOP_TIMEOUT_S)
            except (OSError, urllib.error.URLError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        _reap([p for p in family if p is not None], STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        found: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return found


def _reap(processes: Iterable[psutil.Process], timeout: float) -> None:
    """Wait up to ``timeout`` for ``processes`` to exit; kill those still there."""
    _gone, alive = psutil.wait_procs(list(processes), timeout=timeout)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def _write_settings(env: dict[str, str]) -> None:
    settings = Path(env["JUPYTER_CONFIG_DIR"]) / "lab" / "user-settings"
    for name, values in USER_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _wait_ready(server: LabServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited at start:\n{server.log_text()[-4000:]}")
        try:
            server.api("GET", "/api/status", timeout=2)
            return
        except (OSError, urllib.error.URLError, ValueError):
            time.sleep(0.2)
    raise TimeoutError(f"JupyterLab did not answer in {START_TIMEOUT_S} s:\n{server.log_text()}")


def start_lab(
    notebooks: Iterable[Path], workdir: Path, log_path: Path, app: tuple[str, str, str] = LAB
) -> LabServer:
    """Start JupyterLab (``app``: or :data:`CLASSIC`) serving copies of ``notebooks``, with its
    home in ``workdir``.

    Raises if the server exits or does not answer within :data:`START_TIMEOUT_S`; the
    server's output goes to ``log_path``.
    """
    root = workdir / "notebooks"
    root.mkdir(parents=True, exist_ok=True)
    for notebook in notebooks:
        shutil.copy(notebook, root / notebook.name)
    env = isolated_env(workdir / "home")
    _write_settings(env)
    token = secrets.token_hex(24)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):  # another program may take the free port before the server does
        port = free_port()
        module, program, server_class = app
        command = [
            sys.executable,
            "-c",
            BOOTSTRAP,
            str(os.getpid()),
            module,
            program,
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--{server_class}.token={token}"
            if app == CLASSIC
            else f"--IdentityProvider.token={token}",
            f"--{server_class}.{'notebook_dir' if app == CLASSIC else 'root_dir'}={root}",
            f"--{server_class}.allow_remote_access=False",
            # A kernel no browser is connected to, and then the server, end on their own.
            f"--{server_class}.shutdown_no_activity_timeout=300",
            "--MappingKernelManager.cull_idle_timeout=300",
            f"--{server_class}.terminals_enabled=False",
        ]
        if app == LAB:
            command += [
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
            ]
        if os.geteuid() == 0:  # a container's root: Jupyter refuses to run without this
            command.append("--allow-root")
        log = log_path.open("wb")
        process = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        server = LabServer(f"http://127.0.0.1:{port}", token, root, process, log_path, env, log)
        try:
            _wait_ready(server)
            return server
        except RuntimeError:
            server.stop()
            if "address already in use" not in server.log_text().lower():
                raise
        except BaseException:
            server.stop()
            raise
    raise RuntimeError(f"JupyterLab found no free port:\n{log_path.read_text(errors='replace')}")
