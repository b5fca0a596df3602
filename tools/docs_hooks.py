"""MkDocs hooks for the documentation site: each notebook's page starts with a link that
downloads the notebook (mkdocs-jupyter copies the ``.ipynb`` beside the page), so that users
who installed the package from an index get the notebooks too."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """Put the download link at the top of a notebook's page."""
    source = PurePosixPath(page.file.src_uri)
    if source.suffix != ".ipynb":
        return html
    link = (
        f'<p class="nb-accel-download"><a href="{source.name}" download>'
        f"Download {source.name}</a> and open it in Jupyter, Colab or Kaggle.</p>"
    )
    return link + html
