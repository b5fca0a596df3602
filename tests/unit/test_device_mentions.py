"""Device concerns live behind the device type: outside the device types, the device backends and
the XLA folders, the package names CUDA (``torch.cuda``, ``"cuda"``, ``"nccl"``,
``uses_nccl(...)``) only in a few places, each an API name of Accelerate's or torch's (the
``"cuda"`` profiler activity, ``RNGType.CUDA``, ``InitProcessGroupKwargs``'s default backend)
or a question Accelerate answers about CUDA itself. Mentions in comments and docstrings do not
count; code does, lazy imports included."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import nb_accel

PACKAGE = Path(nb_accel.__file__).parent
#: Where the device types themselves live: they name their devices as they like.
DEVICE_FOLDERS = ("runtime/device_types/", "runtime/device_backends/", "runtime/cuda_origin.py")
#: The most mentions the rest of the package may have.
MOST_MENTIONS = 15
#: String constants that name CUDA or its collectives' backend.
NAMES = frozenset({"cuda", "nccl"})


def _counted(relative: str) -> bool:
    """Whether the module at ``relative`` (to the package) counts: not a device type's own."""
    return not relative.startswith(DEVICE_FOLDERS) and "xla/" not in relative


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of ``tree``'s module, classes and functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement in node.body:
                value = getattr(statement, "value", None)
                if isinstance(statement, ast.Expr) and isinstance(value, ast.Constant):
                    found.add(id(value))
    return found


def _mention(node: ast.AST, docstrings: set[int]) -> str | None:
    """What ``node`` names of CUDA, or ``None``."""
    if isinstance(node, ast.Attribute) and node.attr == "cuda":
        if isinstance(node.value, ast.Name) and node.value.id == "torch":
            return "torch.cuda"
    if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in docstrings:
        return repr(node.value)
    if isinstance(node, ast.Call):
        called = node.func
        name = getattr(called, "id", None) or getattr(called, "attr", None)
        if name == "uses_nccl":
            return "uses_nccl("
    if isinstance(node, ast.Import):
        if any(alias.name.startswith("torch.cuda") for alias in node.names):
            return "import torch.cuda"
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.cuda"):
        return "from torch.cuda import"
    return None


def mentions(path: Path) -> Iterator[tuple[int, str]]:
    """Each CUDA mention in the code of the module at ``path``, in reading order: its line and
    what it names."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        what = _mention(node, docstrings)
        if what is not None:
            found.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), what))
    for line, _, what in sorted(found):
        yield line, what


def package_mentions() -> list[str]:
    """Every counted mention of the package, as ``module.py:line: what``."""
    places = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if _counted(relative):
            places += [f"{relative}:{line}: {what}" for line, what in mentions(path)]
    return places


def test_cuda_is_named_in_few_places_outside_the_device_types() -> None:
    places = package_mentions()
    assert len(places) <= MOST_MENTIONS, (
        f"{len(places)} mentions of CUDA outside the device types (at most {MOST_MENTIONS}): ask "
        "the rank's DeviceType instead:\n" + "\n".join(places)
    )


@pytest.mark.parametrize(
    ("code", "counted"),
    [
        ("import torch\nx = torch.cuda.is_available()", ["torch.cuda"]),
        ("def f(b):\n    return uses_nccl(b)", ["uses_nccl("]),
        ("x = torch.device('cuda', 0)\ny = 'nccl'", ["'cuda'", "'nccl'"]),
        ("from torch.cuda import Stream", ["from torch.cuda import"]),
        ('def f():\n    """Runs on "cuda" and "nccl"."""\n    # torch.cuda\n    return 1', []),
        ("x = 'cuda:0'", []),
    ],
)
def test_the_count_sees_code_not_words(tmp_path: Path, code: str, counted: list[str]) -> None:
    """The counter counts code, not docstrings or comments (it would otherwise pass by
    counting nothing, or fail on prose)."""
    module = tmp_path / "module.py"
    module.write_text(code + "\n")
    assert [what for _, what in mentions(module)] == counted


def test_the_device_folders_are_left_out() -> None:
    assert not _counted("runtime/device_types/cuda.py")
    assert not _counted("runtime/xla/device_type.py")
    assert not _counted("launch/xla/launcher.py")
    assert _counted("runtime/data/rng.py") and _counted("launch/pool.py")
