"""``python -m infera_core.launcher.pdeathsig CMD [ARG…]``: die with the launcher, then exec CMD.

The launcher starts every engine through this tiny program instead of running Python
code between ``fork`` and ``exec`` (``preexec_fn``): the launcher has other threads
(gRPC's, for etcd), and a forked child of a threaded process may only run
async-signal-safe code (see :mod:`infera_core.launcher.process` for how it spawns).

On Linux it asks for SIGTERM when the parent (the launcher) dies, even by ``kill -9``,
and exits at once if the parent is already gone (``INFERA_LAUNCHER_PID`` names it).
The process keeps its pid across the ``exec``, so the launcher watches the engine itself.
"""

from __future__ import annotations

import os
import signal
import sys

PARENT_ENV = "INFERA_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def arm(parent: int | None) -> bool:
    """Request SIGTERM on the parent's death; False when the parent is already gone."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    return parent is None or os.getppid() == parent


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.exit("usage: python -m infera_core.launcher.pdeathsig CMD [ARG...]")
    parent = os.environ.pop(PARENT_ENV, None)
    if not arm(int(parent) if parent and parent.isdigit() else None):
        sys.exit(0)  # the launcher died before the engine started: start nothing
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        sys.exit(f"cannot run {args[0]}: {exc.strerror}")


if __name__ == "__main__":
    main()
