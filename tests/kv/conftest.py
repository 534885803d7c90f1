"""Fixtures shared by the KV index tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infera_core.kv import accel


@pytest.fixture(params=["python", "native"])
def ingest(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test on the pure-Python index, then on the C one (``accel.ops`` swapped)."""
    native = accel.native_ops()
    if request.param == "native":
        assert native is not None, "infera-kv-native is not built (it needs a C compiler when installed)"
    before = accel.ops
    accel.ops = native if request.param == "native" else accel.PYTHON  # type: ignore[assignment]
    yield request.param
    accel.ops = before


@pytest.fixture
def native() -> Iterator[accel.Ops]:
    """The C extension's hot loops in use (``accel.ops`` swapped) for the test."""
    ops = accel.native_ops()
    assert ops is not None, "infera-kv-native is not built (it needs a C compiler when installed)"
    before = accel.ops
    accel.ops = ops
    yield ops
    accel.ops = before
