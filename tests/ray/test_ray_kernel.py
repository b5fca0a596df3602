"""A real Jupyter kernel on the Ray cluster's head node, as a notebook there runs (nbclient
drives it from the head too: the kernel's ports are the head's own): a
``%%distributed --hosts ray`` pool whose ranks keep their variables from cell to cell on both
nodes, a warm launch on the same actors, a rank killed and the next launch on new ones; after
``%distributed stop`` and ``stop_workers()``, nothing is left on either node."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import nbformat
import pytest
from ray_cluster import RayCluster

pytestmark = pytest.mark.timeout(240)

#: Runs a notebook in a kernel of its own (both on the head node); each cell's text to JSON.
DRIVER = """
import json, sys
import nbformat
from nbclient import NotebookClient

notebook = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(notebook, timeout=180, kernel_name="python3").execute()
texts = []
for cell in notebook.cells:
    text = ""
    for output in cell.outputs:
        if output.output_type == "stream":
            text += output.text
        elif output.output_type in ("execute_result", "display_data"):
            text += output.data.get("text/plain", "")
    texts.append(text)
print("CELLS", json.dumps(texts))
"""


def _cells(cluster: RayCluster, cells: list[str]) -> list[str]:
    """Run ``cells`` as a notebook in a kernel on the head node; each cell's output (a cell
    that raises fails the test)."""
    folder = cluster.kernels / "notebook"
    folder.mkdir()
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(notebook, folder / "cells.ipynb")
    (folder / "driver.py").write_text(DRIVER)
    done = subprocess.run(
        cluster.on_head([sys.executable, str(folder / "driver.py"), str(folder / "cells.ipynb")]),
        capture_output=True,
        text=True,
        timeout=220,
        cwd=folder,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("CELLS ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    return list(json.loads(lines[-1].removeprefix("CELLS ")))


def test_cells_and_warm_launches_run_on_the_cluster_s_actors(ray_cluster: RayCluster) -> None:
    head, node = ray_cluster.head.address, ray_cluster.node.address
    texts = _cells(
        ray_cluster,
        [
            "%load_ext nb_accel",
            "%%distributed -n 2 --hosts ray --all-ranks\n"
            "import os, socket\nwhere = socket.gethostname()\nprint('on', rank, where)\n"
            "world_size",
            "%%distributed --all-ranks\nprint(rank, where)",
            "%distributed status",
            "%distributed stop",
            textwrap.dedent(
                """\
                from nb_accel import notebook_launcher, stop_workers
                from nb_accel.errors import WorkerDiedError
                import os, signal, torch.distributed as dist

                def pid():
                    return os.getpid()

                def killed_on_rank_two():
                    if dist.get_rank() == 2:
                        os.kill(os.getpid(), signal.SIGKILL)
                    dist.barrier()

                first = notebook_launcher(pid, num_processes=2, hosts="ray", reuse_workers=True)
                again = notebook_launcher(pid, num_processes=2, hosts="ray", reuse_workers=True)
                try:
                    notebook_launcher(
                        killed_on_rank_two, num_processes=2, hosts="ray", reuse_workers=True
                    )
                except WorkerDiedError as error:
                    print("died:", error)
                fresh = notebook_launcher(pid, num_processes=2, hosts="ray", reuse_workers=True)
                stop_workers()
                print("same:", first == again, "fresh:", len(fresh), set(fresh) & set(first))
                """
            ),
        ],
    )
    started, kept, status, launches = texts[1], texts[2], texts[3], texts[5]
    assert f"on each of 2 hosts over ray ({head}, {node}), 4 ranks for %%distributed" in started
    assert f"[{node} rank 3] on 3 raynode1" in started, started
    assert started.rstrip().endswith("4"), started  # the cell's value: world_size
    assert f"[{head} rank 1] 1 rayhead" in kept, kept  # the variables stayed
    assert head in status and node in status, status
    assert "died: worker for rank 2 (pid" in launches, launches
    assert f"on {node}) was killed" in launches, launches
    assert "same: True fresh: 4 set()" in launches, launches  # new workers after the death
    ray_cluster.settle(30)  # Ray ends the actors' processes just after
    assert ray_cluster.processes() == []
