"""Fixtures shared by the server tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from infera_core.testing.upstream import FakeUpstream, fake_upstreams


@pytest.fixture
async def ups() -> AsyncIterator[list[FakeUpstream]]:
    """Two fake upstreams; a test file that needs another number overrides this fixture."""
    async with fake_upstreams(2) as out:
        yield out
