"""``python -m infera.engine.tgi [flags]``: run tgi as a fleet worker from one flat flag list.

Infera's flags (``--model``, ``--host``, ``--port``, ``--etcd-endpoint``…) are taken, the
engine's spellings of what Infera manages are translated (docs/reference/engines.md), everything else
goes to the engine. ``infera`` and ``infera.engine`` are namespace packages (PEP 420).
"""

from infera_core.cli.alias import flat_main_for

if __name__ == "__main__":
    flat_main_for("tgi")()
