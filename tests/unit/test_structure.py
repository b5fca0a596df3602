"""The package's shape: one-way imports between layers, no cycles, documented public names."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

import nb_accel

PACKAGE = Path(nb_accel.__file__).parent
#: Higher number = higher layer; a module may import only its own layer or lower ones.
LAYERS = {"notebook": 4, "launch": 3, "worker": 2, "runtime": 1}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], 0) if len(parts) > 1 else 0


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, lazy: bool = True) -> list[str]:
    """The modules ``path`` imports; with ``lazy=False`` only those imported when it is loaded
    (not inside its functions)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if lazy else _load_time_statements(tree.body)
    found: list[str] = []
    for node in nodes:
        named = _imported_by_name(node)
        if named is not None:  # importlib.import_module("nb_accel...") is an import too
            found.append(named)
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # "from .. import _env" names a module; "from ... import __version__" a name
            # inside the package's __init__, which is then what is imported
            for alias in node.names:
                inner = f"{name}.{alias.name}"
                found.append(inner if _is_module(inner) else name)
    return found


def _imported_by_name(node: ast.AST) -> str | None:
    """The module an ``importlib.import_module(...)`` or ``__import__(...)`` call names with a
    literal (at load time only when it is a statement of the module's body)."""
    value = node.value if isinstance(node, ast.Expr) else node
    if isinstance(value, ast.Assign):
        value = value.value
    if not isinstance(value, ast.Call) or not value.args:
        return None
    called = value.func
    name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
    first = value.args[0]
    if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
        return str(first.value)
    return None


@functools.cache
def _is_module(name: str) -> bool:
    """True when ``name`` is a module or package of nb_accel."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _load_time_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run when a module is loaded: its body, into ``if``/``try`` blocks."""
    found: list[ast.stmt] = []
    for statement in body:
        found.append(statement)
        if isinstance(statement, ast.If):
            found += _load_time_statements(statement.body + statement.orelse)
        elif isinstance(statement, ast.Try):
            found += _load_time_statements(
                statement.body
                + statement.orelse
                + statement.finalbody
                + [s for handler in statement.handlers for s in handler.body]
            )
    return found


#: The package's front doors (its names, ``python -m nb_accel``) and the modules that re-export
#: names where Accelerate has them (the ``nb_accel.utils`` package, ``nb_accel.logging``, ...)
#: sit above every layer.
FRONT = {
    PACKAGE / f"{name}.py"
    for name in (
        "__init__",
        "__main__",
        "accelerator",
        "logging",
        "data_loader",
        "state",
        "optimizer",
        "scheduler",
    )
}
FRONT |= {
    path
    for folder in ("utils", "tracking", "parallelism_config")
    for path in (PACKAGE / folder).glob("*.py")
}
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p not in FRONT)
FRONT_NAMES = {_module_name(p) for p in FRONT}


@pytest.mark.parametrize("path", MODULES, ids=_module_name)
def test_nothing_below_the_front_door_imports_it(path: Path) -> None:
    """The facade (``nb_accel/__init__.py``) and the re-export modules import the layers; a
    module of a layer or of the base importing from them (its version, a public name) would
    close a cycle through everything the facade loads (lazy imports count)."""
    module = _module_name(path)
    for imported in _imports(path):
        target = imported if _is_module(imported) else imported.rsplit(".", 1)[0]
        assert target not in FRONT_NAMES, f"{module} imports the front door's {imported}"


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


#: A smell detector, not a budget: a module past it most likely holds more than one concern.
MODULE_LINES = 500


def test_modules_stay_small() -> None:
    for path in PACKAGE.rglob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= MODULE_LINES, f"{path.name} has {lines} lines: more than one concern?"


def test_no_two_public_classes_share_a_name() -> None:
    """A class name says which class it is, wherever it is read (two ``Answer`` messages on two
    channels read the same in a traceback, a log or a ``match``)."""
    where: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


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
        if "xla" in name.split(".") and importlib.util.find_spec("torch_xla") is None:
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


#: The layers' folders: their subpackages hold one concern each.
LAYER_FOLDERS = [PACKAGE / name for name in LAYERS]
ALL_MODULES = sorted(PACKAGE.rglob("*.py"))
MODULE_NAMES = {_module_name(p) for p in ALL_MODULES}
PACKAGES = {_module_name(p) for p in ALL_MODULES if p.name == "__init__.py"}


def _unit(module: str) -> str:
    """What the one-way rule is about: a subpackage of a layer as a whole, or a module at the
    top of a layer (``runtime/state.py``, ``launch/launcher.py``) on its own."""
    if module in PACKAGES:
        return module
    parent = module.rsplit(".", 1)[0]
    return module if parent.count(".") <= 1 else parent


def _target(imported: str) -> str | None:
    """The package module ``imported`` names (it may name something inside a module)."""
    if imported in MODULE_NAMES:
        return imported
    parent = imported.rsplit(".", 1)[0]
    return parent if parent in MODULE_NAMES else None


def _is_xla(module: str) -> bool:
    return "xla" in module.split(".")


def _unit_graph(lazy: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ALL_MODULES:
        source = _unit(_module_name(path))
        for imported in _imports(path, lazy=lazy):
            target = _target(imported)
            if target is None or _unit(target) == source or _unit(target).startswith(source + "."):
                continue
            graph.setdefault(source, set()).add(_unit(target))
    return graph


def test_folders_import_one_way() -> None:
    graph = _unit_graph(lazy=True)
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            assert state.get(target) != 1, "folders import each other: " + " -> ".join(
                [*trail, node, target]
            )
            if target not in state:
                visit(target, [*trail, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


#: Outside the xla/ folders, the modules that may import from them: where the launch backends
#: are registered (the XLA device type and device backend are entry points, loaded by name).
XLA_ENTRANCES = 1


def test_few_modules_reach_into_the_xla_folders() -> None:
    """The rest of the package reaches the XLA path through a launcher and a device backend,
    chosen in one place each, rather than through branches everywhere (lazy imports count)."""
    entrances = []
    for path in ALL_MODULES:
        module = _module_name(path)
        targets = {_target(imported) for imported in _imports(path)} - {None}
        if not _is_xla(module) and any(_is_xla(str(target)) for target in targets):
            entrances.append(module)
    assert len(entrances) <= XLA_ENTRANCES, f"modules that import from the xla folders: {entrances}"


@functools.cache
def _loads_torch_xla() -> frozenset[str]:
    """The modules whose loading loads ``torch_xla`` (directly or through what they load)."""
    loads = {_module_name(p): _imports(p, lazy=False) for p in ALL_MODULES}
    found = {m for m, imported in loads.items() if any(i.startswith("torch_xla") for i in imported)}
    grown = True
    while grown:
        more = {m for m, imported in loads.items() if {_target(i) for i in imported} & found}
        grown = not more <= found
        found |= more
    return frozenset(found)


@pytest.mark.parametrize("path", ALL_MODULES, ids=_module_name)
def test_the_xla_path_is_loaded_only_on_demand(path: Path) -> None:
    """Only runtime/xla/ and launch/xla/ import torch_xla, and the other modules load what
    loads it only inside functions that run on the XLA path: nothing else ever loads it."""
    module = _module_name(path)
    if _is_xla(module):
        return
    for imported in _imports(path, lazy=True):
        assert imported.split(".")[0] != "torch_xla", f"{module} imports {imported}"
    assert module not in _loads_torch_xla(), f"loading {module} loads torch_xla"


#: The only modules that import Ray (``hosts="ray"``), inside functions only: loading the
#: package never loads Ray.
RAY_MODULES = ("nb_accel.launch.placement.ray_cluster", "nb_accel.launch.placement.ray_nodes")


@pytest.mark.parametrize("path", ALL_MODULES, ids=_module_name)
def test_ray_is_imported_in_two_modules_and_only_when_a_launch_names_it(path: Path) -> None:
    module = _module_name(path)
    for imported in _imports(path, lazy=module not in RAY_MODULES):
        assert imported.split(".")[0] != "ray", f"{module} imports {imported}"


def test_the_runtime_never_imports_the_kernel_side_nor_the_worker() -> None:
    """The library runs where no launch put it (a script, ``torchrun``): it reaches a worker
    only through the sink the worker installs (lazy imports count)."""
    for path in (PACKAGE / "runtime").rglob("*.py"):
        for imported in _imports(path):
            assert not imported.startswith(
                ("nb_accel.launch", "nb_accel.notebook", "nb_accel.worker")
            ), f"{_module_name(path)} imports {imported}"


@pytest.mark.parametrize("folder", [p.parent for p in ALL_MODULES if p.name == "__init__.py"])
def test_folders_stay_small(folder: Path) -> None:
    modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 15, f"{folder.name}/ holds {len(modules)} modules"
