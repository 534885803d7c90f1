"""The engine-agnostic worker launcher: start an engine, register it, watch it, drain it.

* :class:`~infera_core.launcher.runtime.WorkerLauncher` — the library API (``infera-run up``
  runs several in one process); :func:`~infera_core.launcher.runtime.run_worker` runs one
  with SIGTERM/SIGINT wired to drain.
* :mod:`infera_core.engines.settings` — ``WorkerSettings`` (flags and ``INFERA_*`` env vars).
* :mod:`infera_core.launcher.process` — the engine subprocess (own process group, prefixed
  output, last log lines kept).
* :func:`infera_core.cli.alias.main_for` — ``python -m infera_<engine>`` entry points.
"""
