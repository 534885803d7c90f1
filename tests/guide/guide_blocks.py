"""The code blocks of the plugin tutorials (docs/tutorials/) that a test builds and runs.

A fenced block whose info string has ``file=<path>`` is (part of) a file: blocks naming
the same path are joined in order. A ``bash run=<dir>`` block is a list of commands run
in ``<dir>``. Paths are relative to the workspace the reader starts in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parents[2] / "docs" / "tutorials"
GUIDES = (TUTORIALS / "policy-plugin.md", TUTORIALS / "engine-plugin.md")
"""Followed in this order: the policy plugin, then the engine plugin."""
VENV_PLACEHOLDER = "/path/to/infera/.venv"

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Block:
    kind: str
    """``file`` or ``run``."""
    target: str
    """The file's path, or the directory the commands run in."""
    body: str
    line: int
    """Line of the opening fence in its page (for failure messages)."""
    page: str = ""
    """The page, relative to the repository (for failure messages)."""


def guide_blocks() -> list[Block]:
    """Every ``file=`` and ``run=`` block of the tutorials, in reading order."""
    return [block for page in GUIDES for block in page_blocks(page)]


def page_blocks(page: Path) -> list[Block]:
    """Every ``file=`` and ``run=`` block of one page, in document order."""
    text = page.read_text()
    name = str(page.relative_to(TUTORIALS.parents[1]))
    out = []
    for match in _FENCE.finditer(text):
        attrs = dict(re.findall(r"(\w+)=(\S+)", match["info"]))
        line = text.count("\n", 0, match.start()) + 1
        if "file" in attrs:
            out.append(Block("file", attrs["file"], match["body"], line, name))
        elif "run" in attrs:
            out.append(Block("run", attrs["run"], match["body"], line, name))
    return out


def guide_files(blocks: list[Block]) -> dict[str, str]:
    """Each ``file=`` path with its content (blocks naming one path joined by a blank line)."""
    files: dict[str, str] = {}
    for block in blocks:
        if block.kind == "file":
            before = files.get(block.target)
            files[block.target] = block.body if before is None else f"{before}\n\n{block.body}"
    return files
