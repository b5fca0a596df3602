"""No test writes outside its temporary folder: no file under ``tests/`` names a path in the
machine's shared temporary folders (``/tmp``, ``/var/tmp``, ``/dev/shm``) or in the home folder,
where runs would meet each other's files and leave theirs behind; a test writes under
``tmp_path``. Read from the source (:mod:`ast`): every string constant (the parts of f-strings
too, code sent to workers as text too; docstrings aside) and every call to ``Path.home()`` or
``expanduser``. System paths that are only read (``/proc``, ``/sys``, ``/etc``, ``/dev/null``)
are not looked for. :data:`ALLOWED` lists the few that name such a path for another reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: A path in a shared temporary folder or the home folder, where it starts in a string: not
#: inside a longer path or word (``/work/tmp``, ``a~b``).
SHARED_PATH = re.compile(
    r"(?<![\w.~/-])(?:/tmp|/var/tmp|/dev/shm|/home|/root|~)(?:/[^\s'\"`),]*)?(?=$|[\s'\"`),])"
)

#: (file under tests/, the path it names): why it may.
ALLOWED: dict[tuple[str, str], str] = {
    ("multiproc/own_folders.py", "/tmp"): (
        "the folders a simulated machine has of its own: fresh tmpfs mounted over them in the "
        "machine's own mount namespace, so nothing reaches the real ones"
    ),
    ("multiproc/own_folders.py", "/dev/shm"): "as /tmp: hidden by a tmpfs of the machine's own",
    ("unit/test_model_io.py", "~/weights"): "HOME is set to tmp_path: it is tmp_path/weights",
    ("unit/test_model_io.py", "~"): "tmp_path / '~': checks no folder named '~' was made",
    ("unit/test_config.py", "~/cluster/ssh_config"): "a configuration value, never opened",
    ("unit/test_config_widget.py", "~/cluster/ssh_config"): "a form's value, never opened",
    ("unit/test_whereabouts_parsing.py", "/home/me/train.py"): "a traceback's text, parsed",
    ("chaos/campaign.py", "/dev/shm"): "listed, never written: what a scenario's kernel left",
    ("chaos/campaign.py", "/dev/shm/chaos-filler"): (
        "written in a shm-full scenario's kernel's own /dev/shm: a tmpfs in the kernel's own "
        "mount namespace (unshare --mount), gone with it"
    ),
    ("chaos/campaign.py", "/root"): "part of /proc/<pid>/root: that kernel's own view of it",
    ("ray/ray_cluster.py", "/root"): "part of /proc/<pid>/root: the head node's view, read only",
    ("chaos/notebook_code.py", "/dev/shm"): "where the kernel's own tmpfs is mounted, as above",
    ("multiproc/test_shm_full.py", "/dev/shm"): (
        "where the script's own tmpfs is mounted, in a mount namespace of its own"
    ),
    ("multiproc/test_shm_full.py", "/dev/shm/filler"): "written in that tmpfs, gone with it",
    ("multiproc/test_shared_buffers.py", "/dev/shm"): (
        "listed by a script with a /dev/shm of its own (a tmpfs in its own mount namespace)"
    ),
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ``id`` of each docstring constant of ``tree`` (prose, not paths a test uses)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def shared_paths(source: str) -> list[tuple[int, str]]:
    """The line and the path of each place ``source`` names a shared temporary folder or the
    home folder (``~`` for a call that finds the home folder)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                found += [(node.lineno, m.group()) for m in SHARED_PATH.finditer(node.value)]
        elif isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name in ("home", "expanduser"):
                found.append((node.lineno, "~"))
    return found


def _found() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue  # names the folders it looks for
        name = path.relative_to(TESTS).as_posix()
        for line, named in shared_paths(path.read_text()):
            found.setdefault((name, named), []).append(line)
    return found


@pytest.mark.timeout(60)
def test_no_test_names_a_shared_temporary_folder_or_the_home_folder() -> None:
    found = _found()
    unexplained = [
        f"tests/{name}:{lines[0]}: {path}"
        for (name, path), lines in sorted(found.items())
        if (name, path) not in ALLOWED
    ]
    assert not unexplained, (
        "tests write under their tmp_path, not in a folder other runs share: "
        + "; ".join(unexplained)
    )
    assert not ALLOWED.keys() - found.keys(), "ALLOWED names what no test names any more"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('open("/tmp/capdbg.txt", "w").write("x")', ["/tmp/capdbg.txt"]),
        ('Path(f"/dev/shm/{name}").write_bytes(b"")', ["/dev/shm/"]),
        ('Path("/var/tmp") / "x"', ["/var/tmp"]),
        ("code = \"open('/tmp/out', 'w')\"", ["/tmp/out"]),  # code a worker runs
        ('Path("~/.cache/x").expanduser()', ["~/.cache/x", "~"]),
        ("Path.home() / 'x'", ["~"]),
        ('open("/home/me/notes")', ["/home/me/notes"]),
        ('Path("/proc/self/maps").read_text(); open("/dev/null", "w")', []),
        ('Path("/work/tmp/x"); "/etc/hosts"; "a~b"; "/tmpfs"', []),
        ('def f():\n    """Writes nothing to /tmp."""', []),
    ],
)
def test_the_scan_finds_shared_paths(source: str, expected: list[str]) -> None:
    assert sorted(path for _, path in shared_paths(source)) == sorted(expected)
