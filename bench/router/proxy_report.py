"""The report of ``bench.router.proxy_overhead``: its measured rows and the Markdown tables
(per case, CPU ratios against sglang-router and the native HTTP hop, ``--processes``
scaling and the ceilings the machine's cores allow)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Result:
    rps: float
    p50: float
    p99: float
    errors: int


@dataclass
class Row:
    target: str
    mode: str
    concurrency: int
    result: Result
    cpu_us: float | None
    upstream_us: float | None = None
    client_us: float | None = None


def table(rows: list[Row], chunks: int) -> str:
    """The Markdown report: one line per row (``chunks``: data chunks per stream), then the ratios."""
    direct = {(r.mode, r.concurrency): r.result for r in rows if r.target == "direct"}
    out = [
        "| target | mode | conc | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | router CPU µs/req"
        " | router CPU µs/chunk | upstreams CPU µs/req | client CPU µs/req |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d = direct.get((r.mode, r.concurrency))
        add50 = f"{(r.result.p50 - d.p50) * 1e3:+.2f}" if d and r.target != "direct" else "-"
        add99 = f"{(r.result.p99 - d.p99) * 1e3:+.2f}" if d and r.target != "direct" else "-"
        cpu = f"{r.cpu_us:.0f}" if r.cpu_us is not None else "-"
        per_chunk = f"{r.cpu_us / chunks:.1f}" if r.cpu_us is not None and r.mode != "json" else "-"
        err = f" ({r.result.errors} errors)" if r.result.errors else ""
        out.append(
            f"| {r.target} | {r.mode} | {r.concurrency} | {r.result.rps:.0f}{err} | {r.result.p50 * 1e3:.2f} | "
            f"{r.result.p99 * 1e3:.2f} | {add50} | {add99} | {cpu} | {per_chunk} | {_us(r.upstream_us)} | {_us(r.client_us)} |"
        )
    out.extend(cpu_ratios(rows))
    out.extend(scaling(rows))
    return "\n".join(out)


def _us(v: float | None) -> str:
    return f"{v:.0f}" if v is not None else "-"


def scaling(rows: list[Row]) -> list[str]:
    """req/s of each ``serve --processes N`` run (targets ``…-pN``) over the one-process run."""
    base = {(r.target, r.mode, r.concurrency): r.result.rps for r in rows}
    multi = [r for r in rows if "-p" in r.target]
    if not multi:
        return []
    cases = list(dict.fromkeys((r.mode, r.concurrency) for r in multi))
    out = ["", "| req/s vs 1 process | " + " | ".join(f"{m} c{c}" for m, c in cases) + " |"]
    out.append("|---|" + "---:|" * len(cases))
    for target in dict.fromkeys(r.target for r in multi):
        one = target.rsplit("-p", 1)[0]
        cells = []
        for m, c in cases:
            a, b = base.get((target, m, c)), base.get((one, m, c))
            cells.append(f"{a:.0f} / {b:.0f} = {a / b:.2f}×" if a and b else "-")
        out.append(f"| {target} | " + " | ".join(cells) + " |")
    return out + ceilings(rows)


def ceilings(rows: list[Row], cores: int | None = None) -> list[str]:
    """What ``--processes N`` can gain on this machine, from each component's CPU per request.

    The router, the fake upstreams and the load generator share the machine's cores. With
    r, u, c their CPU µs per request, the whole stack serves at most cores / (r + u + c)
    requests/s, and one router process at most 1 core / r: the ceiling is the smaller.
    N processes lift only the second (min(N, cores) / r), so their ceiling over one
    process's is what the others leave the router: the router's share of the stack's CPU × the
    cores is what it can use at the stack's ceiling (under 1: one process is enough). "cores used" = req/s × (r + u + c): how
    much of the machine the stack actually got (the rest went to other work).
    """
    cores = cores or len(os.sched_getaffinity(0))
    by = {(r.target, r.mode, r.concurrency): r for r in rows}
    multi = [r for r in rows if "-p" in r.target and r.cpu_us and r.upstream_us is not None]
    if not multi:
        return []
    out = [
        "",
        f"| ceiling on {cores} cores | CPU µs/req router 1 → N proc / upstreams / client | router share "
        "(× cores) | ceiling req/s 1 → N proc | ceiling ratio | measured ratio | of ceiling ratio "
        "| cores used 1 → N proc |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for m in multi:
        one = by.get((m.target.rsplit("-p", 1)[0], m.mode, m.concurrency))
        if one is None or not one.cpu_us or one.upstream_us is None or one.client_us is None:
            continue
        n = int(m.target.rsplit("-p", 1)[1])
        r1, rn = one.cpu_us, m.cpu_us or 0.0
        u, c = (one.upstream_us + (m.upstream_us or 0.0)) / 2, (one.client_us + (m.client_us or 0.0)) / 2
        ceil1 = min(1e6 / r1, cores * 1e6 / (r1 + u + c))
        ceiln = min(min(n, cores) * 1e6 / rn, cores * 1e6 / (rn + u + c))
        measured = m.result.rps / one.result.rps
        used1 = one.result.rps * (r1 + u + c) / 1e6
        usedn = m.result.rps * (rn + u + c) / 1e6
        out.append(
            f"| {m.target} {m.mode} c{m.concurrency} | {r1:.0f} → {rn:.0f} / {u:.0f} / {c:.0f} "
            f"| {r1 / (r1 + u + c):.2f} ({cores * r1 / (r1 + u + c):.2f}) | {ceil1:.0f} → {ceiln:.0f} | {ceiln / ceil1:.2f}× | {measured:.2f}× "
            f"| {measured / (ceiln / ceil1):.2f} | {used1:.2f} → {usedn:.2f} |"
        )
    return out


def cpu_ratios(rows: list[Row]) -> list[str]:
    """Per case: each Infera variant's router CPU per request over sglang-router's and over
    the native HTTP hop's (``infera``)."""
    return _ratios(rows, "sglang-router") + _ratios(rows, "infera")


def _ratios(rows: list[Row], base: str) -> list[str]:
    sgl = {(r.mode, r.concurrency): r.cpu_us for r in rows if r.target == base and r.cpu_us}
    variants = sorted({r.target for r in rows if r.target.startswith("infera") and r.target != base})
    if not sgl or not variants:
        return []
    cases = list(sgl)
    out = [
        "",
        f"| CPU µs/req vs {base} | " + " | ".join(f"{m} c{c}" for m, c in cases) + " |",
        "|---|" + "---:|" * len(cases),
    ]
    for v in variants:
        mine = {(r.mode, r.concurrency): r.cpu_us for r in rows if r.target == v}
        cells = []
        for case in cases:
            m, s = mine.get(case), sgl[case]
            cells.append(f"{m:.0f} / {s:.0f} = {m / s:.2f}×" if m and s else "-")
        out.append(f"| {v} | " + " | ".join(cells) + " |")
    return out
