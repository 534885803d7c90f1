"""Stand-in for ``python -m atom.entrypoints.openai_server``: ATOM's flags, served by infera-sim.

Installed by the engine tests as ``atom/entrypoints/openai_server.py`` in a fake engine venv.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    p = argparse.ArgumentParser(prog="atom.entrypoints.openai_server")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--server-port", type=int, default=8000)
    p.add_argument("--port", type=int, default=8006, help="ATOM's internal engine port")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-transfer-config", default="{}")
    args, _unknown = p.parse_known_args()
    argv = [
        sys.executable,
        "-m",
        "infera_sim.server",
        "--model",
        args.served_model_name or args.model,
        "--host",
        args.host,
        "--port",
        str(args.server_port),
        "--block-size",
        str(args.block_size),
        "--speedup",
        "100",
    ]
    print("stand-in atom: exec", " ".join(argv[1:]), flush=True)
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
