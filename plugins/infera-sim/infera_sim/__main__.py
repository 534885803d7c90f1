"""``python -m infera_sim …`` is ``infera-run worker sim …``."""

from infera_core.launcher.alias import main_for

main_for("sim")()
