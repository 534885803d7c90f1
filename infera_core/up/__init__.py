"""``infera-run up``: the whole stack in one process (discovery, server, N workers).

* :class:`~infera_core.up.stack.Stack` — library API (``async with Stack(settings) as s``),
  used by the CLI, ``infera-run bench --policies`` and the fleet-scale script.
* :mod:`~infera_core.up.settings` — ``UpSettings`` (flags and ``INFERA_*`` env vars).
* :mod:`~infera_core.up.status` — the compact live status line.
* :mod:`~infera_core.up.demo` — ``--demo``: a shared-prefix workload, kv-aware vs round-robin.
"""
