"""The code blocks of docs/plugin-guide.md that a test builds and runs.

A fenced block whose info string has ``file=<path>`` is (part of) a file: blocks naming
the same path are joined in order. A ``bash run=<dir>`` block is a list of commands run
in ``<dir>``. Paths are relative to the workspace the reader starts in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugin-guide.md"
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
    """Line of the opening fence in the guide (for failure messages)."""


def guide_blocks(text: str | None = None) -> list[Block]:
    """Every ``file=`` and ``run=`` block of the guide, in document order."""
    text = GUIDE.read_text() if text is None else text
    out = []
    for match in _FENCE.finditer(text):
        attrs = dict(re.findall(r"(\w+)=(\S+)", match["info"]))
        line = text.count("\n", 0, match.start()) + 1
        if "file" in attrs:
            out.append(Block("file", attrs["file"], match["body"], line))
        elif "run" in attrs:
            out.append(Block("run", attrs["run"], match["body"], line))
    return out


def guide_files(blocks: list[Block]) -> dict[str, str]:
    """Each ``file=`` path with its content (blocks naming one path joined by a blank line)."""
    files: dict[str, str] = {}
    for block in blocks:
        if block.kind == "file":
            before = files.get(block.target)
            files[block.target] = block.body if before is None else f"{before}\n\n{block.body}"
    return files
