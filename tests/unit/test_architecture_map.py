"""ARCHITECTURE.md is the map of the package as it is: every folder has its row in the folders
table, every module is named in its folder's row, and every module of the base is named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import nb_accel

PACKAGE = Path(nb_accel.__file__).parent
MAP = PACKAGE.parent / "ARCHITECTURE.md"
FOLDERS = sorted(
    str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE
)


def _rows() -> dict[str, str]:
    """The folders table: each folder's row, by the folder's path inside the package."""
    text = MAP.read_text()
    table = text[text.index("## Folders") : text.index("## A launch")]
    rows: dict[str, str] = {}
    for line in table.splitlines():
        found = re.match(r"\| `([^`]+)/` \| (.*) \|$", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_folder_and_its_modules_are_on_the_map(folder: str) -> None:
    row = _rows().get(folder)
    assert row is not None, f"ARCHITECTURE.md's folders table has no row for `{folder}/`"
    unnamed = [
        module.name
        for module in sorted((PACKAGE / folder).glob("*.py"))
        if module.name != "__init__.py" and f"`{module.name}`" not in row
    ]
    assert not unnamed, f"the row of `{folder}/` does not name {unnamed}"


def test_the_map_names_no_folder_that_is_gone() -> None:
    gone = sorted(set(_rows()) - set(FOLDERS))
    assert not gone, f"ARCHITECTURE.md has rows for folders that do not exist: {gone}"


def test_every_module_at_the_top_is_named() -> None:
    text = MAP.read_text()
    unnamed = [
        m.name
        for m in sorted(PACKAGE.glob("*.py"))
        if not re.search(rf"(?<![\w/]){re.escape(m.name)}\b", text)
    ]
    assert not unnamed, f"ARCHITECTURE.md does not name {unnamed}"
