"""Lean labelled counters and histograms for the per-request hot path.

``prometheus_client``'s ``Counter.inc`` / ``Histogram.observe`` take a lock and validate
on every call (3–5 µs each, five or more per proxied request). These keep plain numbers
on ``__slots__`` objects (the server updates them from its event loop only) and turn
them into ordinary metric families when ``/metrics`` is scraped, with the same names,
labels and bucket bounds a ``prometheus_client`` metric would have.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


def _go(value: float) -> str:
    """A bucket bound as ``prometheus_client`` writes it (``0.005``, ``1.0``)."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket i: bounds[i-1] < value <= bounds[i]
        self.sum += value


class LeanCounter:
    """A counter family; ``child(labels)`` is cached per label values."""

    __slots__ = ("children", "doc", "labelnames", "name")

    def __init__(self, name: str, doc: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = list(labelnames)
        self.children: dict[tuple[str, ...], CounterChild] = {}

    def child(self, labels: tuple[str, ...]) -> CounterChild:
        c = self.children.get(labels)
        if c is None:
            c = self.children[labels] = CounterChild()
        return c

    def family(self) -> CounterMetricFamily:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for labels, c in self.children.items():
            fam.add_metric(list(labels), c.value)
        return fam


class LeanHistogram:
    """A histogram family with fixed bucket bounds (upper bounds, ascending)."""

    __slots__ = ("bounds", "children", "doc", "labelnames", "name")

    def __init__(self, name: str, doc: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = list(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], HistogramChild] = {}

    def child(self, labels: tuple[str, ...]) -> HistogramChild:
        c = self.children.get(labels)
        if c is None:
            c = self.children[labels] = HistogramChild(self.bounds)
        return c

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        les = [_go(b) for b in self.bounds] + ["+Inf"]
        for labels, c in self.children.items():
            total = 0
            buckets = []
            for le, n in zip(les, c.counts, strict=True):
                total += n
                buckets.append((le, float(total)))
            fam.add_metric(list(labels), buckets, c.sum)
        return fam


class LeanCollector(Collector):
    """Exports lean series from a ``CollectorRegistry``."""

    def __init__(self, series: Iterable[LeanCounter | LeanHistogram]) -> None:
        self._series = list(series)

    def collect(self) -> Iterable[Any]:
        for s in self._series:
            yield s.family()

    def describe(self) -> Iterable[Any]:
        for s in self._series:
            yield s.family().__class__(s.name, s.doc, labels=s.labelnames)
