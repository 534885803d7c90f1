"""``python -m infera_sglang …`` is ``infera-run worker sglang …``."""

from infera_core.launcher.alias import main_for

main_for("sglang")()
