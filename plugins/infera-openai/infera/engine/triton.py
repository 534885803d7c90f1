"""``python -m infera.engine.triton [flags]``: triton as a fleet worker from one flat flag list, as
:func:`infera_core.cli.alias.flat_main_for` explains (the spellings it translates: docs/reference/engines.md)."""

from infera_core.cli.alias import flat_main_for

if __name__ == "__main__":
    flat_main_for("triton")()
