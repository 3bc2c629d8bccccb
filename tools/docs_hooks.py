"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

- Reference markers (``<!-- reference:NAME -->``) in a page become the tables
  :mod:`fastrecover_tools.docs_reference` builds from the code.
- ``CHANGELOG.md`` at the repository root is published as ``changelog.md``: one
  file, read by people on GitHub and on the site alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from fastrecover_tools.docs_reference import expand

ROOT_PAGES = {"changelog.md": "CHANGELOG.md"}


def on_files(files: Files, config: Any) -> Files:
    root = Path(config["config_file_path"]).parent
    for uri, name in ROOT_PAGES.items():
        files.append(File.generated(config, uri, content=(root / name).read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return expand(markdown)
