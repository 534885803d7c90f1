"""Whole-router figures from the snapshots of the server processes of ``serve --processes N``.

Each process keeps its own counters (no lock, no shared memory on the hot path); the
process that answers ``/metrics``, ``/v1/workers``, ``/v1/admin/stats`` or
``/v1/admin/usage`` asks its siblings for their snapshot (:mod:`infera_core.server.peers`)
and merges them here:

* counters, histograms and summaries are summed; a ``_created`` sample keeps the oldest;
* gauges a process measures of itself (requests in flight, its memory) are summed; the
  others describe the fleet as every process sees it (KV blocks mirrored, stale workers,
  breaker state) and show the largest value any process reports;
* per worker: in-flight and picks are summed, the breaker shows the worst state;
* per API key: requests and tokens per model are summed; ``tokens_today`` is the
  router's budget count, which every process reads from the shared budgets
  (:mod:`infera_core.server.budgets`), so the largest is shown, not the sum.

Snapshots are plain JSON (``family_json`` / ``merge_families`` for the metrics).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric

SUMMED_GAUGES = frozenset(
    {
        "infera_worker_in_flight",
        "infera_pd_role_in_flight",
        "infera_kv_index_memory_bytes",
        "infera_routing_tokenize_prefix_cache_bytes",
        "infera_routing_tokenize_cache_bytes",
    }
)
"""Gauges one process measures of itself: the router's figure is the sum."""

_BREAKER_ORDER = {"closed": 0, "half-open": 1, "open": 2}
_SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram", "unknown"})


def family_json(metric: Metric) -> dict[str, Any]:
    """One collected metric family as JSON."""
    return {
        "name": metric.name,
        "type": metric.type,
        "doc": metric.documentation,
        "unit": metric.unit,
        "samples": [[s.name, s.labels, s.value] for s in metric.samples],
    }


def merge_families(snapshots: Iterable[Sequence[dict[str, Any]]]) -> list[Metric]:
    """The families of every process, merged by the rules in the module docstring."""
    heads: dict[str, dict[str, Any]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for families in snapshots:
        for fam in families:
            name = fam["name"]
            head = heads.setdefault(name, fam)
            if head["type"] != fam["type"]:
                continue  # cannot happen between processes of one build
            add = _combiner(name, head["type"])
            merged = values.setdefault(name, {})
            for sname, labels, value in fam["samples"]:
                key = (sname, tuple(sorted(labels.items())))
                old = merged.get(key)
                if old is None:
                    merged[key] = float(value)
                elif sname.endswith("_created"):
                    merged[key] = min(old, float(value))
                else:
                    merged[key] = add(old, float(value))
    out = []
    for name, head in heads.items():
        metric = Metric(name, head["doc"], head["type"], head["unit"])
        for (sname, labels), value in values.get(name, {}).items():
            metric.add_sample(sname, dict(labels), value)
        out.append(metric)
    return out


def _combiner(name: str, kind: str) -> Any:
    if kind in _SUMMED_TYPES or (kind == "gauge" and name in SUMMED_GAUGES):
        return lambda a, b: a + b
    return max


def worst_breaker(states: Iterable[str]) -> str:
    return max(states, key=lambda s: _BREAKER_ORDER.get(s, 0), default="closed")


def merge_workers(snapshots: Sequence[dict[str, list[Any]]]) -> dict[str, tuple[int, int, str]]:
    """``worker_id → [in_flight, picks, breaker]`` per process → summed, summed, worst."""
    out: dict[str, tuple[int, int, str]] = {}
    for snap in snapshots:
        for wid, (inflight, picks, breaker) in snap.items():
            old = out.get(wid)
            if old is None:
                out[wid] = (int(inflight), int(picks), str(breaker))
            else:
                out[wid] = (old[0] + int(inflight), old[1] + int(picks), worst_breaker((old[2], breaker)))
    return out


def overlay_workers(rows: list[dict[str, Any]], merged: dict[str, tuple[int, int, str]]) -> None:
    """Put the whole router's in-flight, picks and breaker on per-worker rows (in place)."""
    for row in rows:
        got = merged.get(row["worker_id"])
        if got is not None:
            row["in_flight"], row["picks"], row["breaker"] = got


def merge_usage(snapshots: Sequence[list[dict[str, Any]] | None]) -> list[dict[str, Any]] | None:
    """``GET /v1/admin/usage``'s ``keys`` of every process: spending summed per key and model."""
    if all(s is None for s in snapshots):
        return None
    by_key: dict[str, dict[str, Any]] = {}
    for keys in snapshots:
        for entry in keys or []:
            name = entry["key"]
            have = by_key.get(name)
            if have is None:
                by_key[name] = {**entry, "models_used": {m: dict(v) for m, v in entry["models_used"].items()}}
                continue
            if "tokens_today" in entry:  # the router's count, read by each process: not summed
                have["tokens_today"] = max(have.get("tokens_today", 0), entry["tokens_today"])
            for model, spent in entry["models_used"].items():
                mine = have["models_used"].setdefault(model, {})
                for field, n in spent.items():
                    mine[field] = mine.get(field, 0) + n
    return list(by_key.values())


def merge_stats(snapshots: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``GET /v1/admin/stats`` of every process (the first is the answering one's) → the router's."""
    out = dict(snapshots[0])
    out["workers"] = [dict(w) for w in out["workers"]]
    workers = merge_workers(
        [
            {w["worker_id"]: [w["in_flight"], w["picks"], w["breaker"]] for w in s["workers"]}
            for s in snapshots
        ]
    )
    overlay_workers(out["workers"], workers)
    out["requests"] = _sum_rows(snapshots, "requests", ("route", "model", "status"))
    out["tokens"] = _sum_rows(snapshots, "tokens", ("model", "kind"))
    out["retries"] = sum(s["retries"] for s in snapshots)
    out["breakers_opened"] = sum(s["breakers_opened"] for s in snapshots)
    pd: dict[str, float] = {}
    for s in snapshots:
        for k, v in s["pd_failures"].items():
            pd[k] = pd.get(k, 0.0) + v
    out["pd_failures"] = pd
    moved: dict[str, float] = {}
    for s in snapshots:
        for k, v in s.get("migrations", {}).items():
            moved[k] = moved.get(k, 0.0) + v
    out["migrations"] = moved
    out["histograms"] = {
        name: _sum_histogram([s["histograms"][name] for s in snapshots]) for name in out["histograms"]
    }
    out["usage"] = merge_usage([s["usage"] for s in snapshots])
    return out


def _sum_rows(snapshots: Sequence[dict[str, Any]], field: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for s in snapshots:
        for row in s[field]:
            k = tuple(row[f] for f in key)
            have = rows.get(k)
            if have is None:
                rows[k] = dict(row)
            else:
                have["count"] += row["count"]
    return list(rows.values())


def _sum_histogram(hists: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out = {"bounds": hists[0]["bounds"], "labels": hists[0]["labels"], "series": {}}
    series: dict[str, dict[str, Any]] = out["series"]
    for h in hists:
        for labels, s in h["series"].items():
            have = series.get(labels)
            if have is None:
                series[labels] = {"counts": list(s["counts"]), "sum": s["sum"]}
            else:
                have["counts"] = [a + b for a, b in zip(have["counts"], s["counts"], strict=True)]
                have["sum"] += s["sum"]
    return out
