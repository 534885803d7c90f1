"""Hook implementations of the infera-atom plugin."""

from __future__ import annotations
