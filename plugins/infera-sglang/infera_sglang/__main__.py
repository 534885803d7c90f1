"""``python -m infera_sglang …`` is ``infera-run worker sglang …``."""

from infera_core.cli.alias import main_for

main_for("sglang")()
