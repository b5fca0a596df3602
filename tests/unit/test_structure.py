"""The package's shape: one-way imports between layers, no cycles, documented public names."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

import nb_accel

PACKAGE = Path(nb_accel.__file__).parent
#: Higher number = higher layer; a module may import only its own layer or lower ones.
LAYERS = {"notebook": 3, "launch": 2, "runtime": 1}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], 0) if len(parts) > 1 else 0


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[str]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if node.module is None:  # "from .. import _env": the names are modules
                found += [f"{name}.{alias.name}" for alias in node.names]
            else:
                found.append(name)
    return found


#: The package's front door and the ``nb_accel.utils`` re-export module sit above every layer.
FRONT = {PACKAGE / "__init__.py", PACKAGE / "utils.py"}
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p not in FRONT)


@pytest.mark.parametrize("path", MODULES, ids=_module_name)
def test_imports_only_go_down_the_layers(path: Path) -> None:
    module = _module_name(path)
    for imported in _imports(path):
        if imported.startswith("nb_accel."):
            assert _layer(imported) <= _layer(module), f"{module} imports higher layer {imported}"
        if _layer(module) < LAYERS["notebook"]:
            assert imported.split(".")[0] not in ("IPython", "ipywidgets"), (
                f"{module} imports {imported}; only nb_accel.notebook may"
            )


def test_no_import_cycles() -> None:
    graph = {
        _module_name(p): {i for i in _imports(p) if i.startswith("nb_accel")}
        for p in PACKAGE.rglob("*.py")
    }
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> None:
        if node in done:
            return
        assert node not in visiting, "import cycle: " + " -> ".join([*trail, node])
        visiting.add(node)
        for target in graph.get(node, set()):
            if target in graph:
                visit(target, [*trail, node])
        visiting.discard(node)
        done.add(node)

    for name in graph:
        visit(name, [])


def test_modules_stay_small() -> None:
    for path in PACKAGE.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, f"{path.name} exceeds 400 lines"


@pytest.mark.parametrize("name", nb_accel.__all__)
def test_every_public_name_is_documented(name: str) -> None:
    obj = getattr(nb_accel, name)
    assert inspect.getdoc(obj), f"nb_accel.{name} has no docstring"
    if inspect.isclass(obj):
        for attribute, member in vars(obj).items():
            if not attribute.startswith("_") and (
                inspect.isfunction(member) or isinstance(member, property)
            ):
                assert inspect.getdoc(member), f"nb_accel.{name}.{attribute} has no docstring"


def _importable_modules() -> list[str]:
    """Every module of the package, but those that need ``torch_xla`` when it is missing."""
    names = []
    for path in MODULES + sorted(FRONT):
        name = _module_name(path)
        if "xla" in name.rsplit(".", 1)[-1] and importlib.util.find_spec("torch_xla") is None:
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("module", _importable_modules())
def test_every_name_a_module_exports_is_documented(module: str) -> None:
    loaded = importlib.import_module(module)
    assert inspect.getdoc(loaded), f"{module} has no docstring"
    for name in getattr(loaded, "__all__", []):
        obj = getattr(loaded, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        assert inspect.getdoc(obj), f"{module}.{name} has no docstring"
        if inspect.isclass(obj) and obj.__module__ == module:
            for attribute, member in vars(obj).items():
                if not attribute.startswith("_") and (
                    inspect.isfunction(member) or isinstance(member, property)
                ):
                    assert inspect.getdoc(member), f"{module}.{name}.{attribute} has no docstring"
