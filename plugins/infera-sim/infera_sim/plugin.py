"""Hook implementations of the infera-sim plugin."""

from __future__ import annotations
