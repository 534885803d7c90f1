"""``python -m infera_sim …`` is ``infera-run worker sim …``."""

from infera_core.cli.alias import main_for

main_for("sim")()
