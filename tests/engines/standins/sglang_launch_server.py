"""Stand-in for ``python -m sglang.launch_server``: accepts SGLang's flags, serves through infera-sim.

Installed by the engine tests as ``sglang/launch_server.py`` in a fake engine venv, so the
launcher runs the exact argv the sglang adapter builds. Unknown SGLang flags are accepted
and ignored; ``--stand-in-exit-code N`` makes it print a line and exit (start-up failure).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _port(endpoint: str | None) -> str | None:
    return endpoint.rsplit(":", 1)[1] if endpoint else None


def main() -> None:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--kv-events-config")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--disaggregation-mode", default="null")
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--stand-in-exit-code", type=int, default=None)
    args, _unknown = p.parse_known_args()
    if args.stand_in_exit_code is not None:
        print(f"stand-in sglang: failing on purpose with code {args.stand_in_exit_code}", flush=True)
        sys.exit(args.stand_in_exit_code)
    kv = json.loads(args.kv_events_config) if args.kv_events_config else {}
    argv = [
        sys.executable,
        "-m",
        "infera_sim.server",
        "--model",
        args.served_model_name or args.model_path,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--block-size",
        str(args.page_size),
        "--speedup",
        "100",
    ]
    if _port(kv.get("endpoint")):
        argv += ["--kv-events-port", str(_port(kv.get("endpoint")))]
    if _port(kv.get("replay_endpoint")):
        argv += ["--kv-replay-port", str(_port(kv.get("replay_endpoint")))]
    if args.disaggregation_mode in ("prefill", "decode"):
        argv += ["--role", args.disaggregation_mode, "--pd-protocol", "sglang-bootstrap"]
        if args.disaggregation_mode == "prefill":
            argv += ["--bootstrap-port", str(args.disaggregation_bootstrap_port)]
    print("stand-in sglang: exec", " ".join(argv[1:]), flush=True)
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
