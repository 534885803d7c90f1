"""Mixed fleet vs PD fleet of the same size on a long-prompt workload, with ``infera-run bench --compare``.

    .venv/bin/python -m bench.fleet.pd_vs_mixed [--workers 4] [--input-len 2000] [--output-len 64]
        [--prefill 2] [--num-requests 160] [--concurrency 16] [--speedup 1] [--pd-protocol vllm-nixl]
        [--json out.json]

Starts ``infera-run up --workers N`` and ``infera-run up --prefill N/2 --decode N/2`` (sim engine,
real-time timing model unless ``--speedup``), runs the same random long-prompt workload against
both (``bench --compare --url A --url B``), prints the comparison, and stops both stacks.
TTFT and ITL come from the sims' timing model (prefill ``--prefill-tokens-per-s``, decode
step ``--itl-base-ms`` + slope); on a mixed worker a long prefill stalls every running decode.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

from infera_core.util.net import stop_process

READY = re.compile(r"Infera ready: (http://\S+/v1)")


class Up:
    def __init__(self, label: str, args: list[str]) -> None:
        self.label = label
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infera_core", "up", "--port", "0", "--quiet", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.url: str | None = None
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            m = READY.search(line)
            if m:
                self.url = m.group(1)
                self.ready.set()
        self.ready.set()

    def wait(self, timeout: float) -> str:
        if not self.ready.wait(timeout) or self.url is None:
            raise SystemExit(f"{self.label} stack did not start:\n" + "\n".join(self.lines[-20:]))
        return self.url

    def stop(self) -> None:
        stop_process(self.proc, grace=30, sig=signal.SIGINT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="fleet size (both fleets)")
    ap.add_argument("--prefill", type=int, default=None, help="PD fleet: prefill workers [default: half]")
    ap.add_argument("--input-len", type=int, default=2000)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--speedup", type=float, default=1.0, help="sim time runs this much faster")
    ap.add_argument("--pd-protocol", default="vllm-nixl")
    ap.add_argument("--policy", default="kv-aware", help="mixed fleet's routing preset")
    ap.add_argument("--json", default=None, help="write bench results here")
    a = ap.parse_args()
    engine = ["--", "--speedup", str(a.speedup), "--max-model-len", str(max(4096, 2 * a.input_len + 256))]
    half = a.prefill if a.prefill is not None else a.workers // 2
    if not 0 < half < a.workers:
        raise SystemExit(f"--prefill must be between 1 and {a.workers - 1}")
    stacks = [
        Up("mixed", ["--workers", str(a.workers), "--policy", a.policy, *engine]),
        Up(
            "pd",
            [
                "--prefill",
                str(half),
                "--decode",
                str(a.workers - half),
                "--pd-protocol",
                a.pd_protocol,
                *engine,
            ],
        ),
    ]
    try:
        urls = [s.wait(180) for s in stacks]
        print(
            f"mixed: {urls[0]}  ({a.workers} mixed)\npd:    {urls[1]}  ({half} prefill + {a.workers - half} decode)"
        )
        cmd = [
            sys.executable, "-m", "infera_core", "bench", "--compare",
            "--url", urls[0], "--url", urls[1],
            "--workload", "random", "--input-len", str(a.input_len), "--output-len", str(a.output_len),
            "--num-requests", str(a.num_requests), "--concurrency", str(a.concurrency),
            "--seed", "1", "--quiet",
        ]  # fmt: skip
        if a.json:
            cmd += ["--json", a.json]
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        print(f"(bench took {time.perf_counter() - t0:.0f}s, rc={rc})")
    finally:
        for s in stacks:
            s.stop()


if __name__ == "__main__":
    main()
