"""``weighted_sum`` (``infera_core.scheduling.arrays``), the scheduler's Σ clip(score, 0, 1) ·
weight over its scorers' arrays: the C pass gives the numpy specification's results to the bit
(random and edge-case scores: NaN, ±inf, −0.0, outside [0, 1]; bounded parts unclipped), takes
what numpy would (lists, float32, strided views), and a profile picks as it did."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from infera_core.scheduling import arrays
from infera_core.scheduling.arrays import py_weighted_sum, weighted_sum

BUILT = arrays._native_sum() is not None
SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1e300, 1e300, 5e-324, 1.0 + 1e-16]


@pytest.fixture
def native() -> Iterator[None]:
    """The C pass in use for the test (whatever ``INFERA_KV_NATIVE`` says), then as it was."""
    if not BUILT:
        pytest.skip("infera-kv-native built without a compiler")
    was = arrays._native, arrays._native_weighted
    arrays.use_native_kernels(True)
    assert arrays._native_weighted is not None
    yield
    arrays._native, arrays._native_weighted = was


def _bits(x: np.ndarray) -> list[bytes | str]:
    return ["nan" if v != v else np.float64(v).tobytes() for v in x]


@pytest.mark.parametrize("seed", range(4))
def test_the_c_pass_equals_the_numpy_specification_bit_for_bit(seed: int, native: None) -> None:
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"):
        for _ in range(300):
            n, k = int(rng.integers(1, 1100)), int(rng.integers(1, 9))
            parts = [rng.normal(0.5, 1.0, n) for _ in range(k)]
            for p in parts:
                hit = rng.random(n) < 0.05
                p[hit] = rng.choice(SPECIAL, int(hit.sum()))
            weights = [float(w) for w in rng.normal(0.5, 1.0, k)]
            bounded = [bool(b) for b in rng.random(k) < 0.3]
            got, want = weighted_sum(parts, weights, bounded), py_weighted_sum(parts, weights, bounded)
            assert _bits(got) == _bits(want), (n, k, weights, bounded)


def test_it_takes_what_numpy_takes(native: None) -> None:
    base = np.linspace(-0.5, 1.5, 64)
    parts = [base.tolist(), base.astype(np.float32), np.repeat(base, 2)[::2], base]
    weights, bounded = [1.0, 0.5, 2, 0.25], [False, False, True, False]
    want = py_weighted_sum([np.asarray(p, np.float64) for p in parts], weights, bounded)
    assert _bits(weighted_sum(parts, weights, bounded)) == _bits(want)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        weighted_sum([base, base[:10]], [1.0, 1.0], [False, False])


def test_without_the_extension_numpy_runs_it() -> None:
    was = arrays._native, arrays._native_weighted
    arrays.use_native_kernels(False)
    try:
        assert arrays._native_weighted is None
        got = weighted_sum([np.array([-1.0, 0.5, 2.0])], [2.0], [False])
        assert got.tolist() == [0.0, 1.0, 2.0]
    finally:
        arrays._native, arrays._native_weighted = was
