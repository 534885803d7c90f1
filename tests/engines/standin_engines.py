"""The stand-in engine entry points in ``standins/`` (SGLang's and ATOM's flags, served by infera-sim)."""

from __future__ import annotations

from pathlib import Path

STANDINS = Path(__file__).parent / "standins"


def standin_source(name: str) -> str:
    """Source of a stand-in engine entry point (``sglang_launch_server`` / ``atom_openai_server``)."""
    return (STANDINS / f"{name}.py").read_text()
