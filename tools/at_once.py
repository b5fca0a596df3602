"""Run several pytest runs at once, each line of their output shown after the run's name as it
comes; the exit code is the first nonzero of theirs (0: every run passed). An interrupt stops
them all.

Usage: python tools/at_once.py NAME=ARGUMENTS [NAME=ARGUMENTS ...]

ARGUMENTS are one run's pytest arguments, split as a shell splits them. Each run gets a base
temporary folder of its own (``--basetemp``), removed after: runs at once never share one.
``make test`` runs the suite's two halves this way, and ``tools/chaos_shards.py`` the chaos
campaign's shards.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]


def _show(name: str, width: int, lines: IO[str]) -> None:
    """Print each line of ``lines`` after ``name``."""
    for line in lines:
        sys.stdout.write(f"[{name:<{width}}] {line}")
        sys.stdout.flush()


def run_at_once(runs: dict[str, list[str]]) -> int:
    """Run pytest with each of ``runs``' arguments at once, from the repository's root; the
    first nonzero exit code (0: all passed)."""
    width = max(map(len, runs))
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="pytest-at-once-") as folder:
        started: dict[str, subprocess.Popen[str]] = {}
        shown: list[threading.Thread] = []
        try:
            for name, arguments in runs.items():
                command = [
                    *(sys.executable, "-m", "pytest", f"--basetemp={Path(folder) / name}"),
                    *arguments,
                ]
                run = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                )
                started[name] = run
                assert run.stdout is not None
                thread = threading.Thread(target=_show, args=(name, width, run.stdout))
                thread.start()
                shown.append(thread)
            codes = {name: run.wait() for name, run in started.items()}
        except KeyboardInterrupt:
            for run in started.values():
                run.terminate()
            for run in started.values():
                run.wait()
            raise
        finally:
            for thread in shown:
                thread.join()
            for run in started.values():
                if run.stdout is not None:
                    run.stdout.close()
    for name, code in codes.items():
        print(f"{name}: {'passed' if code == 0 else f'failed (exit code {code})'}")
    return next((code for code in codes.values() if code != 0), 0)


def main() -> int:
    """Run the command line's runs; the exit code."""
    runs: dict[str, list[str]] = {}
    for given in sys.argv[1:]:
        name, equals, arguments = given.partition("=")
        if not equals or not name:
            raise SystemExit(f"{given!r}: give each run as NAME=ARGUMENTS (see {__file__})")
        runs[name] = shlex.split(arguments)
    if not runs:
        raise SystemExit(__doc__)
    return run_at_once(runs)


if __name__ == "__main__":
    sys.exit(main())
