"""Every code block of the documentation (``docs/*.md`` and the README) runs as written, or
says it is a fragment.

A Python block whose first line is ``# fragment: <where it goes>`` is a piece of a larger
program, shown to explain one call; the reader sees that it is. Every other Python block is
notebook code: the blocks of one page run in order, as the cells of one notebook, in a real
Jupyter kernel started in a folder of its own (what they write lands there). A block that
means to raise says so in a comment (``# raises ZeroDivisionError``) and must raise that;
every other block must end without an error. A prompt (``%debug``, ``breakpoint()``) is
answered ``q``.

Shell blocks (``bash``) hold the install and ``make`` commands that the packaging tests and the
Makefile's own lanes run; text blocks show output. The README's first launch runs in
``test_readme_cell.py`` and is left out here. The pages run in ``make test-docs`` (marker
``docs_code``: a page's launches take a few seconds each); the first test, which reads them
only, runs with the rest."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from kernel_driver import run_answering, running_kernel

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
#: The README's first launch, run by its own test.
FIRST_LAUNCH = re.compile(r"\[start:first-launch\] -->\n```python\n(.*?)```", re.S)
FRAGMENT = "# fragment:"
RAISES = re.compile(r"#\s*raises (\w+)")
#: Languages of blocks that are not run here, and why.
NOT_RUN = {
    "bash": "install and make commands: the packaging tests and the Makefile's lanes run them",
    "text": "output, shown",
}


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page, its line there, its language and its source."""

    page: Path
    line: int
    language: str
    source: str

    @property
    def where(self) -> str:
        """``docs/fsdp.md:181``."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def fragment(self) -> bool:
        """Whether the block says it is a fragment."""
        return self.source.startswith(FRAGMENT)


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, in order (the README's first launch left out)."""
    text = page.read_text()
    skipped = {m.group(1) for m in FIRST_LAUNCH.finditer(text)}
    found = []
    for match in FENCE.finditer(text):
        if match.group(2) in skipped:
            continue
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match.group(1), match.group(2)))
    return found


def runnable(page: Path) -> list[Block]:
    """The blocks of ``page`` that run as written."""
    return [b for b in blocks(page) if b.language == "python" and not b.fragment]


@pytest.mark.timeout(30)
def test_every_block_is_known_and_every_page_with_code_runs_here() -> None:
    kinds = {b.language for page in PAGES for b in blocks(page)}
    assert kinds <= {"python", *NOT_RUN}, kinds - {"python", *NOT_RUN}
    for page in PAGES:
        for block in blocks(page):
            if block.language != "python":
                assert FRAGMENT not in block.source, block.where
    assert any(runnable(page) for page in PAGES)


@pytest.mark.docs_code
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "page", [p for p in PAGES if runnable(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_a_pages_code_runs_as_written(page: Path, tmp_path: Path) -> None:
    with running_kernel(tmp_path) as (_, client):
        for block in runnable(page):
            run, _prompts = run_answering(client, block.source, [])
            wanted = RAISES.search(block.source)
            if wanted:
                assert run.ename == wanted.group(1), (block.where, run)
            else:
                assert run.status == "ok", (block.where, run.ename, run.evalue, run.stderr)
