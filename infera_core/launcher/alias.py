"""``python -m infera_<engine> …`` as an alias of ``infera-run worker <engine> …``.

Each engine plugin's ``__main__.py`` is one line: ``main_for("vllm")()``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def main_for(engine: str) -> Callable[..., None]:
    """A ``main(argv=None)`` that runs ``infera-run worker <engine> <argv>``."""

    def main(argv: Sequence[str] | None = None) -> None:
        from infera_core.cli import main as cli_main

        args = list(sys.argv[1:] if argv is None else argv)
        cli_main(["worker", engine, *args])

    main.__doc__ = f"infera-run worker {engine} …"
    return main
