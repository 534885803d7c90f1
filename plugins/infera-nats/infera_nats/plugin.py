"""Entry point of the ``infera-nats`` distribution (hook implementations)."""

from __future__ import annotations
