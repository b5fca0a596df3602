"""What a package index shows and what pip installs: the built wheel's files and metadata."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from built_wheel import ROOT, wheel_metadata, wheel_names
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPOSITORY = "https://github.com/nb-accel/nb_accel"
#: The documentation site (``site_url`` in mkdocs.yml): its pages are built from ``docs/``.
SITE = "https://nb-accel.github.io/nb_accel/"
#: Engines imported only when asked for, and the extra that installs each.
OPTIONAL = {
    "torch-xla": "xla",
    "torchdata": "stateful",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    # the module `mlflow` comes from mlflow-skinny where only it is installed, from both where
    # full mlflow is (the extra names the client, which full mlflow depends on)
    "mlflow-skinny": "mlflow",
    "mlflow": "mlflow",
    "trackio": "trackio",
    "aim": "aim",
    "comet-ml": "comet-ml",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
    "ray": "ray",
}
#: Where the module's distribution is another one than the extra names.
_PROVIDED_BY = {"mlflow": "mlflow-skinny"}


def _requirements(wheel: Path) -> dict[str, list[Requirement]]:
    """The wheel's requirements by extra ("" for those of every install)."""
    found: dict[str, list[Requirement]] = {}
    for line in wheel_metadata(wheel).get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        extra = ""
        if requirement.marker is not None:
            match = re.search(r'extra\s*==\s*"([^"]+)"', str(requirement.marker))
            extra = match.group(1) if match else ""
        found.setdefault(extra, []).append(requirement)
    return found


def _imported_distributions() -> set[str]:
    """The distributions whose modules the package's code imports (anywhere, even in a
    function), by canonical name."""
    by_module = importlib.metadata.packages_distributions()
    names: set[str] = set()
    for path in (ROOT / "nb_accel").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "nb_accel":
                    continue
                names.update(canonicalize_name(d) for d in by_module.get(top, [top]))
    return names


def test_the_wheel_ships_py_typed_and_the_licence(wheel: Path) -> None:
    names = wheel_names(wheel)
    assert "nb_accel/py.typed" in names  # type checkers use the package's own hints
    licence = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert licence, names
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    metadata = wheel_metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]


def test_the_metadata_links_the_repository_and_classifies_the_package(wheel: Path) -> None:
    metadata = wheel_metadata(wheel)
    urls = dict(line.split(", ", 1) for line in metadata.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls), urls
    assert all(url.startswith((REPOSITORY, SITE)) for url in urls.values()), urls
    assert urls["Documentation"] == SITE
    classifiers = metadata.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and "Framework :: Jupyter" in classifiers
    python = re.fullmatch(r">=3\.(\d+)", metadata["Requires-Python"])
    assert python and f"Programming Language :: Python :: 3.{python.group(1)}" in classifiers
    assert metadata.get_payload().startswith("# nb_accel")  # the README is the description


def test_every_package_the_code_imports_is_declared(wheel: Path) -> None:
    requirements = _requirements(wheel)
    declared = {canonicalize_name(r.name) for r in requirements.get("", [])}
    for name in sorted(_imported_distributions()):
        if name in OPTIONAL:
            extra = requirements.get(OPTIONAL[name], [])
            wanted = _PROVIDED_BY.get(name, name)
            assert wanted in {canonicalize_name(r.name) for r in extra}, (name, OPTIONAL[name])
            assert name not in declared, f"{name} is an optional engine, not a dependency"
        else:
            assert name in declared, f"the code imports {name}; it is not a dependency"
    assert "numpy" in declared  # torch's collectives of Python objects need it


def test_the_xla_extra_never_names_torch(wheel: Path) -> None:
    """torch_xla's wheels name no torch; neither does the extra, so it never replaces torch."""
    extra = {canonicalize_name(r.name): r for r in _requirements(wheel).get("xla", [])}
    assert set(extra) == {"torch-xla"}, extra


def test_the_readme_links_work_on_a_package_index_page() -> None:
    """A package index shows the README away from the repository: relative links break."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)", text)
    targets += re.findall(r"""(?:href|src)\s*=\s*["']([^"']+)""", text)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, flags=re.MULTILINE)
    assert targets, "no links found: the pattern is out of date"
    relative = [t for t in targets if not re.match(r"(https?://|mailto:)", t)]
    assert not relative, f"relative links in README.md: {relative}"
    headings = {_slug(h) for h in re.findall(r"^#+\s+(.+)$", text, flags=re.MULTILINE)}
    for target in targets:
        within = re.match(re.escape(REPOSITORY) + r"/(?:blob|tree|raw)/main/([^#]+)", target)
        if within:
            assert (ROOT / within.group(1)).exists(), f"README.md links {target}: no such file"
        if target.startswith(SITE):
            assert _site_source(target), f"README.md links {target}: no such page in docs/"
        if target.startswith(REPOSITORY + "#"):
            assert target.split("#", 1)[1] in headings, f"README.md links {target}: no heading"


def _site_source(url: str) -> Path | None:
    """The file of ``docs/`` (or the notebook) the site builds the page at ``url`` from."""
    page = url[len(SITE) :].split("#", 1)[0].strip("/")
    if not page:
        return ROOT / "docs" / "index.md"
    for source in (ROOT / "docs" / f"{page}.md", ROOT / "docs" / page / "index.md"):
        if source.exists():
            return source
    notebook = ROOT / f"{page}.ipynb"
    return notebook if page.startswith("notebooks/") and notebook.exists() else None


def test_the_readme_shows_the_first_step_on_its_first_screen() -> None:
    """A newcomer reads a short README and finds how to try it without scrolling."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"
    first_screen = "\n".join(lines[:30])
    for step in ("make lab", "make demo", "make test", "pip install nb-accel"):
        assert step in first_screen, f"{step!r} is not on the README's first screen"


def _slug(heading: str) -> str:
    """The anchor a repository page gives a README heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_wheel_declares_the_xla_entry_points_the_registries_load(wheel: Path) -> None:
    """XLA's device type and device backend are found through the wheel's entry points: an
    installed package must declare them, or a TPU runtime would launch on the CPU."""
    import configparser
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        declared = configparser.ConfigParser()
        declared.read_string(archive.read(name).decode())
    assert declared["nb_accel.device_types"]["xla"] == "nb_accel.runtime.xla.device_type:XlaDevices"
    assert declared["nb_accel.device_backends"]["xla"] == "nb_accel.runtime.xla:xla_backend"


def test_the_lanes_ci_runs_install_the_package_as_users_get_it() -> None:
    """CI runs every lane after ``make test`` (each a timed ``step``; the install tests in the
    background meanwhile), and the lanes install the package with the dependencies it
    declares (a hand-written list drifts from them)."""
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [line.split()[1] for line in run if line.startswith("step ")]
    commands = [f"make {target}" for target in steps]
    assert commands == [
        "make test-setup",
        "make test",
        "make lint",
        "make test-colab-kernels",
        "make test-kaggle",
        "make test-classic",
        "make test-xla",
        "make test-trackers",
        "make test-ray",
        "make test-browser",
        "make test-docs",
        "make test-chaos",
        "make docs",
    ]
    background = [line.split()[1] for line in run if line.strip().startswith("in_background ")]
    assert background == ["test-colab-units", "test-install"]  # meanwhile, in the background
    makefile = (ROOT / "Makefile").read_text()
    lanes = re.findall(
        r"^(\$\((?:TRACKERS|RAY)_VENV\)/\.installed):.*\n((?:\t.*\n)+)", makefile, re.M
    )
    names = [name for name, _ in lanes]
    assert names == ["$(TRACKERS_VENV)/.installed", "$(RAY_VENV)/.installed"]  # their lanes
    for name, recipe in lanes:
        installs = [line for line in recipe.splitlines() if "-e " in line]
        assert installs and all("--no-deps" not in line for line in installs), name
        assert re.search(r'-e "\.\[', recipe), f"{name} installs the package with its extras"
    # the stacks' lanes: their environments install the project with its extras and what it
    # declares, under the service's constraints (tools/lane_env.py)
    for name in ("colab", "kaggle", "xla"):
        assert re.search(rf"^test-\w+:.*\n(?:\t.*\n)*?.*\$\(LANE_ENV\) {name}\)", makefile, re.M)
    made = (ROOT / "tools" / "lane_env.py").read_text()
    assert 'project = f"{ROOT}[{lane.extras}]"' in made
    assert '"install", "--quiet", "-c", str(venv / "constraints.txt"), *wanted' in made


def _notebook_imports() -> set[str]:
    """The top-level modules the notebooks' code cells import (a ``%%distributed`` cell's
    body too: its workers import them)."""
    import nbformat
    from IPython.core.inputtransformer2 import TransformerManager

    modules: set[str] = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            source = cell.source
            if source.startswith("%%"):  # a cell magic: its body is Python, run elsewhere
                source = source.split("\n", 1)[1] if "\n" in source else ""
            code = TransformerManager().transform_cell(source)
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "nb_accel"}


def test_the_first_setup_installs_what_the_notebooks_need_and_no_more(wheel: Path) -> None:
    """``make demo`` and ``make lab`` set up the package with its ``examples`` extra only (the
    test extra, Transformers, the trackers and the rest, come with ``make test``), and that is
    enough for every module the notebooks import."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^\$\(BIN\)/\.nb_accel-installed:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None
    installs = [line for line in recipe.group(1).splitlines() if "-e " in line]
    assert len(installs) == 1 and '-e ".[examples]"' in installs[0], installs
    for target in ("demo", "lab"):
        found = re.search(rf"^{target}:(.*)$", makefile, re.M)
        assert found is not None and found.group(1).split() == ["setup"], target
    requirements = _requirements(wheel)
    offered = {canonicalize_name(r.name) for r in requirements[""] + requirements["examples"]}
    by_module = importlib.metadata.packages_distributions()
    needed = {
        module: {canonicalize_name(d) for d in by_module.get(module, [module])}
        for module in _notebook_imports()
    }
    assert "sklearn" in needed  # the quick start's digits: the scan sees the notebooks' imports
    missing = {module: names for module, names in needed.items() if not names & offered}
    assert missing == {}, f"notebook imports no dependency of the first setup provides: {missing}"
