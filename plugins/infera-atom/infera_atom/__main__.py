"""``python -m infera_atom …`` is ``infera-run worker atom …``."""

from infera_core.cli.alias import main_for

main_for("atom")()
