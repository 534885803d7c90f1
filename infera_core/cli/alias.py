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


def flat_main_for(engine: str) -> Callable[..., None]:
    """A ``main(argv=None)`` for ``python -m infera.engine.<engine>``: one flat flag list.

    Infera's flags are taken, the engine's spellings of what Infera manages are translated,
    everything else is passed to the engine (see :func:`infera_core.cli.worker.flat_worker_args`).
    The engine plugins' ``infera/engine/<engine>.py`` modules call it; ``infera`` and
    ``infera.engine`` are namespace packages (PEP 420) they share: no ``__init__.py``.
    """

    def main(argv: Sequence[str] | None = None) -> None:
        from infera_core.cli import main as cli_main
        from infera_core.cli.worker import flat_worker_args
        from infera_core.errors import InferaError
        from infera_core.plugin.hooks import InferaHooks

        args = list(sys.argv[1:] if argv is None else argv)
        try:
            worker_argv = flat_worker_args(InferaHooks.load(), engine, args)
        except InferaError as exc:
            print(f"infera.engine.{engine}: error: {exc}", file=sys.stderr)
            sys.exit(1)
        cli_main(worker_argv)

    main.__doc__ = f"python -m infera.engine.{engine} …"
    return main
