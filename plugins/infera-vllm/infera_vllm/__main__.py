"""``python -m infera_vllm …`` is ``infera-run worker vllm …``."""

from infera_core.cli.alias import main_for

main_for("vllm")()
