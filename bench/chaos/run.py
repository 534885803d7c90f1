"""Chaos: bad inputs and faulty workers thrown at a real stack; a Markdown table of what happened.

    .venv/bin/python -m bench.chaos.run         # every scenario (~5 min on 2 cores)
    .venv/bin/python -m bench.chaos.run --fast  # the quick ones only
    .venv/bin/python -m bench.chaos.run --only deep_json,killed_engine --out table.md
    .venv/bin/python -m bench.chaos.run --only streams_soak --soak-kills 30 --soak-streams 32

The stack (``stack.py``): a real etcd, ``infera-run serve`` (admin token, API-key
file, direct mode) and sim workers under ``infera-run worker`` with
``--restart-engine on-failure``. Each scenario is one ``async def`` decorated with
:func:`scenario` that returns a :class:`Row`: what was tried, what the client saw, what
was lost. After every scenario the runner checks that nothing else was lost: a burst of
ordinary requests all answer 200 and the router's in-flight counts return to zero.
To add a scenario, write one more function in ``clients.py`` or ``faults.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from bench.chaos import clients, faults, nats_plane, prompts, streams  # noqa: F401 - registers their scenarios
from bench.chaos.stack import SCENARIOS, ChaosStack, Row, codes_text

OK_BURST = 8


# -- the runner --------------------------------------------------------------------------------
async def intact(stack: ChaosStack) -> str | None:
    """What ordinary traffic lost after a scenario (None: nothing)."""
    await stack.wait_active(stack.n_workers, 60)
    codes = await stack.burst(OK_BURST)
    problems = []
    if any(c != 200 for c in codes):
        problems.append(f"ordinary requests after it: {codes_text(codes)}")
    if not await stack.settled():
        problems.append("in-flight counts did not return to 0")
    return "; ".join(problems) or None


async def run_scenario(stack: ChaosStack, name: str, limit: float = 240) -> Row:
    fn, _ = SCENARIOS[name]
    try:
        async with asyncio.timeout(limit):
            row = await fn(stack)
    except Exception as exc:  # a scenario that breaks is a row too
        row = Row(name, f"scenario error: {type(exc).__name__}: {exc}"[:200], "?", False)
    after = await intact(stack)
    if after:
        row.lost = after if row.lost == "nothing" else f"{row.lost}; {after}"
        row.ok = False
    return row


def table(rows: list[Row]) -> str:
    lines = ["| what was tried | what the client sees | what is lost |", "|---|---|---|"]
    for r in rows:
        mark = "" if r.ok else " ⚠"
        lines.append(f"| {r.tried} | {r.sees}{mark} | {r.lost} |")
    return "\n".join(lines)


async def main(names: list[str], workers: int) -> list[Row]:
    rows = []
    async with ChaosStack(workers=workers) as stack:
        for name in names:
            t0 = time.monotonic()
            row = await run_scenario(stack, name, streams.SOAK.limit_s if name == "streams_soak" else 240)
            print(
                f"  {name}: {'ok' if row.ok else 'NOT OK'} ({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
    return rows


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument("--fast", action="store_true", help="only the quick scenarios")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, help="also write the Markdown table here")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    soak = streams.SOAK
    p.add_argument(
        "--soak-kills", type=int, default=soak.kills, help="streams_soak: kill -9s of serving workers"
    )
    p.add_argument(
        "--soak-stops", type=int, default=soak.stops, help="streams_soak: SIGSTOPs past the hang threshold"
    )
    p.add_argument("--soak-drains", type=int, default=soak.drains, help="streams_soak: drains (2 s grace)")
    p.add_argument("--soak-streams", type=int, default=soak.streams, help="streams_soak: concurrent streams")
    a = p.parse_args(argv)
    streams.SOAK = streams.Soak(a.soak_kills, a.soak_stops, a.soak_drains, a.soak_streams)
    if a.list:
        for name, (fn, fast) in SCENARIOS.items():
            print(
                f"{name}{' (fast)' if fast else ''}  {(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}"
            )
        return 0
    names = [n for n, (_, fast) in SCENARIOS.items() if fast or not a.fast]
    if a.only:
        names = [n.strip() for n in a.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            p.error(f"unknown scenario(s) {', '.join(unknown)}; see --list")
    rows = asyncio.run(main(names, a.workers))
    text = table(rows)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    bad = sum(not r.ok for r in rows)
    print(f"\n{len(rows) - bad}/{len(rows)} scenarios lost nothing", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(cli())
