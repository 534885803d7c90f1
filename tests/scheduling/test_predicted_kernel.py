"""``predicted_ttft`` (``infera_core.scheduling.arrays``): the C loop gives the numpy specification's
results to the bit, on random and edge-case input (NaN, inf, zero rates, overlaps outside
[0, 1], with and without a backlog, the queued-behind term and the score's shift and scale).

Rates, backlogs and the queued-behind term are never negative (the scorer's are not), so no TTFT
is −0.0: between a −0.0 and a 0.0, which one ``np.min`` returns is its SIMD order's business."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest

from infera_core.scheduling import arrays
from infera_core.scheduling.arrays import predicted_ttft, py_predicted_ttft

BUILT = arrays._native_ttft() is not None


@pytest.fixture
def native() -> Iterator[None]:
    """The C loop in use for the test (whatever ``INFERA_KV_NATIVE`` says), then as it was."""
    if not BUILT:
        pytest.skip("infera-kv-native built without a compiler")
    was = arrays._native
    arrays.use_native_kernels(True)
    yield
    arrays._native = was


ANY = [0.0, -0.0, 1.0, -1e-300, 1.0 + 1e-16, 2.0, -3.0, float("nan"), float("inf"), -float("inf"), 5e-324]
"""Overlaps: anything (they are clipped)."""
NONNEGATIVE = [0.0, 5e-324, 1e-300, 1.0, 1e300, float("inf"), float("nan")]
"""Rates, backlogs, queued-behind terms: never negative."""


def _column(
    rng: random.Random, n: int, scale: float, special: float, values: list[float] = NONNEGATIVE
) -> np.ndarray:
    return np.array(
        [rng.choice(values) if rng.random() < special else rng.random() * scale for _ in range(n)]
    )


def _bits(x: object) -> list[bytes | str]:
    """Each value's bytes, a NaN as "nan" (which NaN an operation on two NaNs carries is the
    hardware's choice; a NaN is never picked and stays NaN either way)."""
    return ["nan" if v != v else np.float64(v).tobytes() for v in np.atleast_1d(np.asarray(x, np.float64))]


def _same(a: tuple[np.ndarray, np.ndarray, float], b: tuple[np.ndarray, np.ndarray, float]) -> bool:
    return all(_bits(x) == _bits(y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("seed", range(6))
def test_the_c_loop_equals_the_numpy_specification_bit_for_bit(seed: int, native: None) -> None:
    rng = random.Random(seed)
    with np.errstate(all="ignore"):
        for _ in range(300):
            n = rng.choice([1, 2, 7, 64, 1024])
            special = rng.choice([0.0, 0.0, 0.05, 0.5])
            overlap = _column(rng, n, 1.2, special, ANY) - 0.1 * (rng.random() < 0.3)
            rate = _column(rng, n, 20000.0, special / 4) + rng.choice([0.0, 1.0, 1e3])
            wait = None
            if rng.random() < 0.6:  # a backlog: 0 where the queue is empty
                wait = np.maximum(_column(rng, n, 2.0, special) - rng.choice([0.0, 1.0]), 0.0)
            qerr = _column(rng, n, 0.5, special) if wait is not None and rng.random() < 0.5 else None
            tokens = rng.choice([0.0, 1.0, 16.0, 1000.0, 8192.0, 1e6])
            factor = rng.choice([None, -1.0 / 0.3, -1.0, -1e-3])
            kept = overlap.copy()
            fast = predicted_ttft(overlap, rate, wait, qerr, tokens, factor)
            spec = py_predicted_ttft(overlap, rate, wait, qerr, tokens, factor)
            assert _same(fast, spec), (n, tokens, factor)
            assert overlap.tobytes() == kept.tobytes()  # the caller's overlap stays as it was


def test_a_list_float32_or_strided_input_is_converted_first(native: None) -> None:
    overlap = [0.5, 1.5, -0.5, 0.25]
    rate = np.array([2000.0, 3000.0, 4000.0, 5000.0])
    wait = np.array([0.0, 0.1, 0.0, 2.0])
    strided = np.repeat(rate, 2)[::2]
    for o, r in ((overlap, rate), (np.array(overlap, np.float32), rate), (np.array(overlap), strided)):
        for w in (None, wait):
            assert _same(
                predicted_ttft(o, r, w, None, 100.0, -2.0), py_predicted_ttft(o, r, w, None, 100.0, -2.0)
            )


def test_without_the_extension_the_numpy_specification_runs() -> None:
    was = arrays._native
    try:
        assert arrays.use_native_kernels(False) is False
        u, t, low = predicted_ttft(np.array([0.5, 0.0]), np.array([1000.0, 500.0]), None, None, 1000.0, None)
        assert u.tolist() == [500.0, 1000.0] and t.tolist() == [0.5, 2.0] and low == 0.5
    finally:
        arrays._native = was
