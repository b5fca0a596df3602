"""Checks a built documentation site (``make docs`` runs it after ``mkdocs build``).

1. No dead internal link: every ``href`` and ``src`` of every page that stays inside the site
   names a file the build wrote, and its ``#anchor`` an ``id`` on that page.
2. Every public name has a reference entry: for each module the API reference documents,
   every name in its ``__all__`` has an entry (an element whose ``id`` is its full path), and
   so does every public member of the classes listed in :data:`MEMBERS` (the Accelerator's
   methods come from several classes of their own).

Usage: ``python tools/check_site.py [SITE_DIR]`` (default ``site``); exits 1 listing what is
wrong.
"""

from __future__ import annotations

import importlib
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

#: The modules the API reference documents, and the page of each (under ``reference/``).
REFERENCE = {
    "nb_accel": "nb_accel",
    "nb_accel.utils": "utils",
    "nb_accel.tracking": "tracking",
    "nb_accel.logging": "logging",
    "nb_accel.errors": "errors",
}

#: Classes whose every public member has an entry of its own, with the page it is on.
MEMBERS = {"nb_accel.Accelerator": "nb_accel"}


class _Page(HTMLParser):
    """The links and the element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.links.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def site_root_path(config: Path = Path("mkdocs.yml")) -> str:
    """The path the site is served under (``/nb_accel/`` for ``site_url``'s), from the
    MkDocs configuration; a link that starts with it is site-absolute."""
    import yaml

    loaded = yaml.load(config.read_text(), Loader=yaml.BaseLoader)  # leaves !!python tags be
    path = urlsplit(str(loaded.get("site_url", "/"))).path or "/"
    return path if path.endswith("/") else path + "/"


def _target(site: Path, page: Path, link: str, root: str) -> tuple[Path, str] | None:
    """The file and anchor ``link`` (on ``page``) names inside the site (served under
    ``root``); ``None`` when it leaves the site (another scheme or host)."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
        return None
    path = unquote(parts.path)
    if not path:
        return page, parts.fragment
    if path.startswith("/"):
        if not path.startswith(root):
            return site / path.lstrip("/"), parts.fragment  # outside the site's path: dead
        base, path = site, path[len(root) :]
    else:
        base = page.parent
    found = (base / path).resolve()
    if found.is_dir() or path.endswith("/"):
        found = found / "index.html"
    return found, parts.fragment


def dead_links(site: Path, root: str = "/") -> list[str]:
    """Every internal link of ``site`` (served under ``root``) whose file or anchor does not
    exist."""
    pages = {path.resolve(): _parse(path) for path in site.rglob("*.html")}
    problems = []
    for path, page in pages.items():
        for link in page.links:
            target = _target(site.resolve(), path, link, root)
            if target is None:
                continue
            file, anchor = target
            where = path.relative_to(site.resolve())
            if not file.exists():
                problems.append(f"{where}: {link} names no file of the site")
            elif anchor and file.suffix == ".html" and anchor not in pages[file].ids:
                problems.append(f"{where}: {link} names no anchor on its page")
    return problems


def missing_reference_entries(site: Path) -> list[str]:
    """Every public name of :data:`REFERENCE`'s modules without an entry in the reference."""
    problems = []
    for module_name, page_name in REFERENCE.items():
        page = site / "reference" / page_name / "index.html"
        if not page.exists():
            problems.append(f"reference/{page_name}: no such page for {module_name}")
            continue
        ids = _parse(page).ids
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            if f"{module_name}.{name}" not in ids:
                problems.append(f"reference/{page_name}: no entry for {module_name}.{name}")
    for path, page_name in MEMBERS.items():
        module_name, class_name = path.rsplit(".", 1)
        page = site / "reference" / page_name / "index.html"
        ids = _parse(page).ids if page.exists() else set()
        cls = getattr(importlib.import_module(module_name), class_name)
        for name in sorted(n for n in dir(cls) if not n.startswith("_")):
            if f"{path}.{name}" not in ids:
                problems.append(f"reference/{page_name}: no entry for {path}.{name}")
    return problems


def main(argv: list[str]) -> int:
    """Check the site; 0 when all is well, else 1 with the problems listed."""
    site = Path(argv[0] if argv else "site")
    if not (site / "index.html").exists():
        print(f"{site} holds no built site: run mkdocs build first", file=sys.stderr)
        return 1
    problems = dead_links(site, site_root_path()) + missing_reference_entries(site)
    for problem in problems:
        print(problem, file=sys.stderr)
    pages = sum(1 for _ in site.rglob("*.html"))
    print(f"{pages} pages checked: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
