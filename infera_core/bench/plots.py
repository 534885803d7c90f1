"""PNG plots for the bench report (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infera_core.errors import ConfigError

if TYPE_CHECKING:
    from infera_core.bench.runner import RunResult


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "--report needs matplotlib: pip install 'infera-core[bench]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax: Any, values: Sequence[float], label: str) -> None:
    if not values:
        return
    xs = sorted(v * 1000 for v in values)
    n = len(xs)
    ax.plot(xs, [(i + 1) / n for i in range(n)], label=label, linewidth=1.6)


def _upper(values: Sequence[float]) -> float | None:
    """x-axis limit: the 99.5th percentile (in ms), so one outlier does not squash the curves."""
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(0.995 * len(xs)))] * 1000 * 1.05


def latency_cdfs(runs: Sequence[RunResult], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    limits: list[list[float]] = [[], [], []]
    for r in runs:
        ok = [x for x in r.results if x.ok]
        series = (
            [x.ttft for x in ok if x.ttft is not None],
            [g for x in ok for g in x.itls],
            [x.e2e for x in ok if x.e2e is not None],
        )
        for k, (ax, values) in enumerate(zip(axes, series, strict=True)):
            _cdf(ax, values, r.label)
            up = _upper(values)
            if up:
                limits[k].append(up)
    titles = ("TTFT", "inter-token latency", "end-to-end latency")
    for ax, title, lim in zip(axes, titles, limits, strict=True):
        if lim:
            ax.set_xlim(0, max(lim))
        ax.set_title(f"{title} (to p99.5)")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests" if title != "inter-token latency" else "fraction of tokens")
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1.01)
        ax.legend(fontsize=8)
    fig.suptitle("Latency CDFs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short(worker: str) -> str:
    return worker if len(worker) <= 14 else worker[:6] + "…" + worker[-6:]


def worker_load(runs: Sequence[RunResult], path: Path) -> bool:
    series = [(r.label, r.summary.get("requests_per_worker") or {}) for r in runs]
    if not any(s for _, s in series):
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(
        figsize=(max(6.0, min(16.0, 1.2 + 0.35 * max(len(s) for _, s in series) * len(runs))), 4.2)
    )
    width = 0.8 / len(series)
    for i, (label, loads) in enumerate(series):
        items = sorted(loads.items(), key=lambda kv: -kv[1])
        xs = [j + i * width for j in range(len(items))]
        ax.bar(xs, [v for _, v in items], width=width, label=label)
    n = max(len(loads) for _, loads in series)
    step = max(1, n // 16)
    ticks = list(range(0, n, step))
    ax.set_xticks([t + 0.4 - width / 2 for t in ticks], [str(t + 1) for t in ticks])
    ax.set_xlabel("worker rank (busiest first, per run)")
    ax.set_ylabel("requests")
    ax.set_title("Requests per worker")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _hit_series(
    tl: Sequence[tuple[float, float, float]], window: float
) -> tuple[list[float], list[float], list[float]]:
    """(times, cumulative hit rate, hit rate over the trailing ``window`` seconds)."""
    xs: list[float] = []
    cum: list[float] = []
    win: list[float] = []
    j = 0
    for t1, h1, q1 in tl:
        if q1 <= 0:
            continue
        while j + 1 < len(tl) and tl[j + 1][0] <= t1 - window:
            j += 1
        _, h0, q0 = tl[j]
        xs.append(t1)
        cum.append(h1 / q1)
        win.append((h1 - h0) / (q1 - q0) if q1 > q0 else float("nan"))
    return xs, cum, win


def hit_rate_over_time(runs: Sequence[RunResult], path: Path) -> bool:
    if not any(len(r.cache.timeline) > 1 for r in runs):
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    window = max(1.0, max(r.duration for r in runs) / 25)
    top = 0.0
    for r in runs:
        xs, cum, win = _hit_series(r.cache.timeline, window)
        if not xs:
            continue
        top = max([top, *(100 * v for v in cum), *(100 * v for v in win if v == v)])
        line = ax.plot(xs, [100 * c for c in cum], label=f"{r.label} (cumulative)", linewidth=1.8)
        ax.plot(
            xs,
            [100 * w for w in win],
            linestyle=":",
            color=line[0].get_color(),
            label=f"{r.label} (last {window:.0f} s)",
        )
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_ylim(0, min(100.0, max(20.0, top * 1.15)))
    ax.set_title("Prefix-cache hit rate over time (worker /metrics)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_all(runs: Sequence[RunResult], out_dir: Path) -> list[str]:
    """Write every plot that has data; returns file names relative to ``out_dir``."""
    names = ["latency_cdf.png"]
    latency_cdfs(runs, out_dir / "latency_cdf.png")
    if worker_load(runs, out_dir / "worker_load.png"):
        names.append("worker_load.png")
    if hit_rate_over_time(runs, out_dir / "hit_rate.png"):
        names.append("hit_rate.png")
    return names


def attainment_vs_workers(
    rows: Sequence[tuple[str, Sequence[tuple[int, float]]]], answer: int | None, slo: str, path: Path
) -> None:
    """SLO attainment (share of requests within every target) against fleet size, one line per
    policy / PD split; the planned fleet size marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in rows:
        xs = [w for w, _ in points]
        ax.plot(xs, [a * 100 for _, a in points], marker="o", linewidth=1.6, label=label)
    if answer is not None:
        ax.axvline(answer, color="grey", linestyle="--", linewidth=1, label=f"plan: {answer} workers")
    ax.set_xlabel("workers")
    ax.set_ylabel("requests within the SLO (%)")
    ax.set_ylim(0, 102)
    ax.set_title(f"SLO attainment vs fleet size ({slo})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
