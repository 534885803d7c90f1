"""``python -m infera.engine.sglang [flags]``: sglang as a fleet worker from one flat flag list, as
:func:`infera_core.cli.alias.flat_main_for` explains (the spellings it translates: the plugin README)."""

from infera_core.cli.alias import flat_main_for

if __name__ == "__main__":
    flat_main_for("sglang")()
