"""Hook implementations of the infera-policies plugin."""

from __future__ import annotations
