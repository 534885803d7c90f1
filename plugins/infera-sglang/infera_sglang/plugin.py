"""Hook implementations of the infera-sglang plugin."""

from __future__ import annotations
