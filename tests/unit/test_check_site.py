"""The built site's checker (``tools/check_site.py``, run by ``make docs``) finds a dead link,
a missing anchor and a public name without a reference entry, on a small site made here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import check_site

sys.path.pop(0)


def _page(site: Path, path: str, body: str) -> None:
    file = site / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(f"<html><body>{body}</body></html>")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site of two pages that link to each other, by path and by anchor."""
    _page(tmp_path, "index.html", '<a href="guide/#setup">guide</a><img src="images/a.png">')
    _page(tmp_path, "guide/index.html", '<h2 id="setup">Setup</h2><a href="../">home</a>')
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"")
    return tmp_path


@pytest.mark.timeout(30)
def test_a_site_whose_links_all_resolve_passes(site: Path) -> None:
    assert check_site.dead_links(site) == []


@pytest.mark.timeout(30)
def test_a_link_to_a_missing_page_or_anchor_is_reported(site: Path) -> None:
    _page(site, "other/index.html", '<a href="../gone/">x</a><a href="../guide/#nowhere">y</a>')
    assert check_site.dead_links(site) == [
        "other/index.html: ../gone/ names no file of the site",
        "other/index.html: ../guide/#nowhere names no anchor on its page",
    ]


@pytest.mark.timeout(30)
def test_links_under_the_site_s_path_and_outside_links(site: Path) -> None:
    _page(site, "404.html", '<a href="/docs/guide/">ok</a><a href="https://example.org/x">out</a>')
    assert check_site.dead_links(site, "/docs/") == []
    _page(site, "404.html", '<a href="/docs/missing/">x</a>')
    assert check_site.dead_links(site, "/docs/") == [
        "404.html: /docs/missing/ names no file of the site"
    ]


@pytest.mark.timeout(30)
def test_a_public_name_without_a_reference_entry_is_reported(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check_site, "REFERENCE", {"nb_accel.logging": "logging"})
    monkeypatch.setattr(check_site, "MEMBERS", {})
    entries = '<div id="nb_accel.logging.get_logger"></div>'
    _page(site, "reference/logging/index.html", entries)
    assert check_site.missing_reference_entries(site) == [
        "reference/logging: no entry for nb_accel.logging.MultiProcessAdapter"
    ]
    both = entries + entries.replace("get_logger", "MultiProcessAdapter")
    _page(site, "reference/logging/index.html", both)
    assert check_site.missing_reference_entries(site) == []


@pytest.mark.timeout(30)
def test_a_listed_class_s_public_member_without_an_entry_is_reported(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check_site, "REFERENCE", {})
    monkeypatch.setattr(check_site, "MEMBERS", {"nb_accel.logging.MultiProcessAdapter": "logging"})
    from nb_accel.logging import MultiProcessAdapter

    public = sorted(n for n in dir(MultiProcessAdapter) if not n.startswith("_"))
    prefix = "nb_accel.logging.MultiProcessAdapter"
    entries = "".join(f'<div id="{prefix}.{name}"></div>' for name in public[1:])
    _page(site, "reference/logging/index.html", entries)
    assert check_site.missing_reference_entries(site) == [
        f"reference/logging: no entry for {prefix}.{public[0]}"
    ]
