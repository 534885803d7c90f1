"""Hypothesis settings shared by the fuzz tests (hypothesis is a development dependency)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def fuzz_settings(max_examples: int) -> settings:
    """``max_examples`` examples over a live rig: no deadline (an example waits on servers), no
    example database, and slow examples and function-scoped fixtures allowed (the rig is shared)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
