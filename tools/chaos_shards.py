"""Run the chaos campaign's shards at once (``make test-chaos`` runs them one after the other).

Usage: python tools/chaos_shards.py [PYTEST OPTIONS]

Each shard of ``tests/chaos/scenarios.py`` (``SHARDS``: the styles whose ranks run on this
machine, and those on other machines) runs in a pytest of its own, both at once; their lines
are shown as they come, each after its shard's name. The exit code is the first nonzero of
theirs (0: both passed). An interrupt stops both.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "chaos"))

from scenarios import SHARDS  # noqa: E402 - found through the path above


def _show(name: str, lines: IO[str]) -> None:
    """Print each line of ``lines`` after ``name``."""
    width = max(map(len, SHARDS))
    for line in lines:
        sys.stdout.write(f"[{name:<{width}}] {line}")
        sys.stdout.flush()


def main() -> int:
    """Run the shards; the exit code."""
    with tempfile.TemporaryDirectory(prefix="chaos-shards-") as folder:
        runs: dict[str, subprocess.Popen[str]] = {}
        shown: list[threading.Thread] = []
        try:
            for name in SHARDS:
                command = [
                    *(sys.executable, "-m", "pytest", "-m", "chaos", "tests/chaos", "-v"),
                    *(f"--chaos-shard={name}", f"--basetemp={Path(folder) / name}"),
                    *sys.argv[1:],
                ]
                runs[name] = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                )
                assert runs[name].stdout is not None
                thread = threading.Thread(target=_show, args=(name, runs[name].stdout))
                thread.start()
                shown.append(thread)
            codes = {name: run.wait() for name, run in runs.items()}
        except KeyboardInterrupt:
            for run in runs.values():
                run.terminate()
            for run in runs.values():
                run.wait()
            raise
        finally:
            for thread in shown:
                thread.join()
            for run in runs.values():
                if run.stdout is not None:
                    run.stdout.close()
    for name, code in codes.items():
        print(f"chaos shard {name}: {'passed' if code == 0 else f'failed (exit code {code})'}")
    return next((code for code in codes.values() if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
