"""Results out: a terminal table, JSON, and a Markdown report with PNG plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from infera_core.errors import ConfigError

if TYPE_CHECKING:
    from infera_core.bench.runner import RunResult

_ROWS: list[tuple[str, str, str]] = [
    # (label, summary path, format)
    ("requests ok / sent", "completed|requests", "ratio"),
    ("duration", "duration_s", "s"),
    ("requests/s", "requests_per_s", "f2"),
    ("output tokens/s", "output_tokens_per_s", "f0"),
    ("TTFT p50", "ttft_s.p50", "ms"),
    ("TTFT p90", "ttft_s.p90", "ms"),
    ("TTFT p99", "ttft_s.p99", "ms"),
    ("ITL p50", "itl_s.p50", "ms"),
    ("ITL p90", "itl_s.p90", "ms"),
    ("ITL p99", "itl_s.p99", "ms"),
    ("e2e p50", "e2e_s.p50", "ms"),
    ("e2e p90", "e2e_s.p90", "ms"),
    ("e2e p99", "e2e_s.p99", "ms"),
    ("goodput req/s", "goodput_requests_per_s", "f2"),
    ("SLO attainment", "slo_attainment", "pct"),
    ("prefix-cache hit rate", "prefix_cache_hit_rate", "pct"),
    ("offloaded-tier hit rate", "offload_hit_rate", "pct"),
    ("cached tokens (usage)", "usage_cached_fraction", "pct"),
    ("load max/mean", "load_imbalance", "f2"),
    ("errors", "errors", "errors"),
]


OPTIONAL_ROWS = {"offload_hit_rate"}
"""Rows shown only when some run has a value (workers with an offloaded KV tier)."""


def _rows(runs: Sequence[RunResult]) -> list[tuple[str, str, str]]:
    return [
        row
        for row in _ROWS
        if row[1] not in OPTIONAL_ROWS or any(_get(r.summary, row[1]) is not None for r in runs)
    ]


def _get(summary: dict[str, Any], path: str) -> Any:
    cur: Any = summary
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def load_imbalance(summary: dict[str, Any]) -> float | None:
    loads = [v for v in (summary.get("requests_per_worker") or {}).values() if v]
    if len(loads) < 2:
        return None
    return float(max(loads)) / float(sum(loads) / len(loads))


def fmt(summary: dict[str, Any], path: str, kind: str) -> str:
    if kind == "ratio":
        a, b = path.split("|")
        return f"{summary.get(a, 0)} / {summary.get(b, 0)}"
    v: Any = load_imbalance(summary) if path == "load_imbalance" else _get(summary, path)
    if kind == "errors":
        return ", ".join(f"{k}: {n}" for k, n in sorted((v or {}).items())) or "none"
    if v is None:
        return "-"
    if kind == "ms":
        return f"{float(v) * 1000:.1f} ms"
    if kind == "s":
        return f"{float(v):.2f} s"
    if kind == "pct":
        return f"{float(v):.1%}"
    if kind == "f0":
        return f"{float(v):.0f}"
    return f"{float(v):.2f}"


def terminal_table(runs: Sequence[RunResult], title: str = "Infera bench", caption: str = "") -> Table:
    table = Table(title=title, caption=caption or None, caption_justify="left")
    table.add_column("metric")
    for r in runs:
        table.add_column(r.label, justify="right")
    for label, path, kind in _rows(runs):
        table.add_row(label, *(fmt(r.summary, path, kind) for r in runs))
    for r in runs:
        if r.router:
            for name in r.router:
                table.add_row(_router_label(name), *(_router_cell(x, name) for x in runs))
            break
    return table


def _router_label(name: str) -> str:
    short = name.removeprefix("infera_").removesuffix("_seconds").replace("_", " ")
    return f"{short} (router, mean)"


def _router_cell(run: RunResult, name: str) -> str:
    d = run.router.get(name)
    return "-" if not d else f"{d['mean_s'] * 1e6:.0f} µs"


def print_table(runs: Sequence[RunResult], console: Console | None = None, caption: str = "") -> None:
    (console or Console()).print(terminal_table(runs, "Infera bench", caption))


def write_json(runs: Sequence[RunResult], path: Path, meta: dict[str, Any]) -> None:
    data = {"meta": meta, "runs": [r.as_dict(with_requests=True) for r in runs]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, default=str))
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write ({exc.strerror})") from None


def markdown(runs: Sequence[RunResult], meta: dict[str, Any], plots: Sequence[str]) -> str:
    lines = ["# Infera bench report", ""]
    for k, v in meta.items():
        lines.append(f"- **{k}**: `{v}`")
    lines += ["", "| metric | " + " | ".join(r.label for r in runs) + " |"]
    lines.append("|---|" + "---:|" * len(runs))
    for label, path, kind in _rows(runs):
        lines.append(f"| {label} | " + " | ".join(fmt(r.summary, path, kind) for r in runs) + " |")
    names = sorted({n for r in runs for n in r.router})
    for n in names:
        lines.append(f"| {_router_label(n)} | " + " | ".join(_router_cell(r, n) for r in runs) + " |")
    for r in runs:
        per = r.cache.per_worker
        if not per:
            continue
        offload = r.cache.offload_hits is not None
        lines += [
            "",
            f"## Workers: {r.label}",
            "",
            "| worker | requests | prompt tokens | hit rate |"
            + (" offloaded-tier hit rate |" if offload else ""),
            "|---|---:|---:|---:|" + ("---:|" if offload else ""),
        ]
        for w, d in sorted(per.items()):
            q = d.get("queries")
            rate = f"{d['hits'] / q:.1%}" if q else "-"
            row = f"| {w} | {d.get('requests', 0):.0f} | {d.get('prompt_tokens', 0):.0f} | {rate} |"
            if offload:
                row += f" {d.get('offload_hits', 0.0) / q:.1%} |" if q else " - |"
            lines.append(row)
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_report(runs: Sequence[RunResult], out_dir: Path, meta: dict[str, Any]) -> Path:
    """``report.md`` plus PNG plots (matplotlib) in ``out_dir``; returns the Markdown path."""
    from infera_core.bench.plots import plot_all

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--report {out_dir}: cannot create directory ({exc.strerror})") from None
    plots = plot_all(runs, out_dir)
    md = out_dir / "report.md"
    md.write_text(markdown(runs, meta, plots))
    write_json(runs, out_dir / "results.json", meta)
    return md
