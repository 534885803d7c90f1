"""Hook implementations of the infera-vllm plugin."""

from __future__ import annotations
