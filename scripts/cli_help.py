#!/usr/bin/env python3
"""The help text of every `shadowsync` command as Markdown (the docs' CLI reference).

    python scripts/cli_help.py      # print it
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands(parser: argparse.ArgumentParser, path: list[str]):
    """(command words, parser) for the parser and every subcommand under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, [*path, name])


def cli_reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from shadowsync.cli import build_parser

    parts = []
    for words, parser in _commands(build_parser(), ["shadowsync"]):
        title = " ".join(words)
        anchor = "options-of-train" if words[1:] == ["train"] else None
        heading = f"## `{title}`" + (f" {{ #{anchor} }}" if anchor else "")
        parts += [heading, "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(cli_reference())
