"""MkDocs hook: the CLI reference page is the argparse help of every command, generated at
build time, so it cannot fall behind the code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

MARK = "<!-- cli-help -->"
ROOT = Path(__file__).resolve().parent.parent


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARK not in markdown:
        return markdown
    sys.path.insert(0, str(ROOT / "scripts"))
    from cli_help import cli_reference

    return markdown.replace(MARK, cli_reference())


