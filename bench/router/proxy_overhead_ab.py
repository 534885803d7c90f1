"""Router CPU per request of two Infera trees side by side, API keys off and on, interleaved.

``bench/router/proxy_overhead.py`` measures one tree per run; on a shared machine two runs
minutes apart differ by more than the effect looked for (±15% here). This script starts
the fake upstreams once and three routers next to each other:

* ``base`` — ``--baseline-venv``'s ``infera-run`` (e.g. a worktree of the commit before
  a change, with its own ``.venv``), no API keys;
* ``off`` — this tree, no API keys;
* ``on`` — this tree with ``--api-key-file`` (one key, budgets that never bite) and the
  key sent with every request, or with ``--on-args`` instead (e.g. tracing on);

each as one server process (``--processes 1`` where the tree has it), then runs
``--rounds`` rounds; each round measures every router (order rotated per
round) for JSON and 64-chunk streams at ``--concurrency``, and the report gives each
router's median router CPU per request (utime+stime from ``/proc``) over the rounds and
its ratio to ``base``::

    git worktree add --detach /tmp/base 6fe89e7 && (cd /tmp/base && bash scripts/setup-dev.sh)
    .venv/bin/python -m bench.router.proxy_overhead_ab --baseline-venv /tmp/base/.venv [--rounds 5]
        [--requests 3000] [--concurrency 16] [--router-nice 0] [--base-keys]

``--base-keys`` runs ``base`` with the API key too, to compare the keys-on path of two trees.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.router import proxy_overhead as po
from bench.router.proxy_report import Row
from infera_core.util.net import free_port


def single_process(infera_run: Path) -> list[str]:
    """``--processes 1`` where ``serve`` has that flag (a tree before it was one process anyway)."""
    out = subprocess.run([str(infera_run), "serve", "--help"], capture_output=True, text=True, check=True)
    return ["--processes", "1"] if "--processes" in out.stdout else []


def router_argv(infera_run: Path, port: int, fleet: Path, extra: list[str], nice: list[str]) -> list[str]:
    argv = [*nice, str(infera_run), "--log-level", "warning", "serve", "--port", str(port)]
    argv += single_process(infera_run)
    argv += ["--upstream-transport", "native", "--discovery", "static", "--static-file", str(fleet)]
    return [*argv, "--router-policy", "round-robin", *extra]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-venv", required=True, type=Path, help="venv whose bin/infera-run is 'base'")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=3000, help="requests per case and round (streams: half)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--router-nice", type=int, default=0, help="run every router under `nice -n N`")
    ap.add_argument("--base-keys", action="store_true", help="base with --api-key-file and the key too")
    ap.add_argument(
        "--on-args",
        help="serve flags of 'on' instead of the API key, e.g. '--otlp-traces-endpoint http://127.0.0.1:4318'",
    )
    args = ap.parse_args()
    base_run = args.baseline_venv / "bin" / "infera-run"
    if not base_run.exists():
        sys.exit(f"error: {base_run} does not exist (--baseline-venv must be a venv with infera-core)")
    here_run = Path(sys.executable).with_name("infera-run")
    nice = ["nice", "-n", str(args.router_nice)] if args.router_nice else []
    ports = [free_port(), free_port()]
    up_urls = [f"http://127.0.0.1:{p}" for p in ports]
    upstreams = [sys.executable, "-m", po.MODULE, "--serve-upstreams", ",".join(map(str, ports))]
    cpu: dict[tuple[str, str], list[float]] = {}
    with (
        po.process(upstreams, up_urls[0] + "/health"),
        tempfile.TemporaryDirectory() as tmp,
        contextlib.ExitStack() as stack,
    ):
        fleet = Path(tmp) / "fleet.yaml"
        workers = [
            {"worker_id": f"up{i}", "url": u, "model": po.MODEL, "engine": "fake"}
            for i, u in enumerate(up_urls)
        ]
        fleet.write_text(yaml.safe_dump({"workers": workers}))
        keys = ["--api-key-file", str(po.write_key_file(Path(tmp)))]
        variants = {
            "base": (base_run, keys if args.base_keys else []),
            "off": (here_run, []),
            "on": (here_run, shlex.split(args.on_args) if args.on_args else keys),
        }
        keyed = ({"base"} if args.base_keys else set()) | (set() if args.on_args else {"on"})
        routers: dict[str, tuple[str, int]] = {}
        for name, (exe, extra) in variants.items():
            port = free_port()
            proc = stack.enter_context(
                po.process(router_argv(exe, port, fleet, extra, nice), f"http://127.0.0.1:{port}/health")
            )
            routers[name] = (f"http://127.0.0.1:{port}/v1/chat/completions", proc.pid)
        names = list(routers)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            print(f"round {r + 1}/{args.rounds}: {' '.join(order)}", file=sys.stderr, flush=True)
            for name in order:
                url, pid = routers[name]
                po.CLIENT_HEADERS.clear()
                if name in keyed:
                    po.CLIENT_HEADERS["Authorization"] = f"Bearer {po.API_KEY}"
                rows: list[Row] = []
                po.measure(name, [url], pid, [args.concurrency], args.requests, rows)
                for row in rows:
                    assert row.cpu_us is not None
                    if row.result.errors:
                        sys.exit(f"error: {name} {row.mode}: {row.result.errors} requests failed")
                    cpu.setdefault((name, row.mode), []).append(row.cpu_us)
    print(report(cpu, names, args))


def report(cpu: dict[tuple[str, str], list[float]], names: list[str], args: argparse.Namespace) -> str:
    modes = ["json", "stream-64"]
    out = [
        f"Router CPU µs/request, c={args.concurrency}, median of {args.rounds} interleaved rounds"
        f" ({args.requests} JSON / {args.requests // 2} stream requests each)",
        "",
        "| router | "
        + " | ".join(modes)
        + " | paired: "
        + " | paired: ".join(modes)
        + " | rounds (json; stream) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    base = {m: statistics.median(cpu[("base", m)]) for m in modes}
    for name in names:
        cells = []
        for m in modes:
            med = statistics.median(cpu[(name, m)])
            cells.append(f"{med:.0f}" + ("" if name == "base" else f" ({(med / base[m] - 1) * 100:+.0f}%)"))
        for m in modes:
            cells.append(
                "" if name == "base" else f"{(paired(cpu[(name, m)], cpu[('base', m)]) - 1) * 100:+.0f}%"
            )
        rounds = "; ".join(" ".join(f"{v:.0f}" for v in cpu[(name, m)]) for m in modes)
        out.append(f"| {name} | " + " | ".join(cells) + f" | {rounds} |")
    out += [
        "",
        "paired: the median over rounds of the router's CPU over base's in the same round (the"
        " machine's load drifts between rounds more than within one)",
    ]
    return "\n".join(out)


def paired(values: list[float], base: list[float]) -> float:
    """Median of the per-round ratios ``values[i] / base[i]``."""
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


if __name__ == "__main__":
    main()
