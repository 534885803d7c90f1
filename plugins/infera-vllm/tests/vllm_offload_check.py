"""Run under the real vLLM venv: resolve offloading argv lists with vLLM's own parser and config.

Reads a JSON list of argv lists (each after ``vllm serve``) on stdin; for each, parses it
with vLLM's server parser and builds the engine config (``create_engine_config``: the
step that turns ``--kv-offloading-size`` into a connector). Prints one JSON list: per
argv the resolved ``KVTransferConfig`` and cache offloading fields, or the error vLLM
raised (``stage``: ``parse`` or ``config``). Not a test module (no ``test_`` prefix).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def transfer(ktc: Any) -> dict[str, Any] | None:
    if ktc is None:
        return None
    return {
        "kv_connector": ktc.kv_connector,
        "kv_role": ktc.kv_role,
        "engine_id": ktc.engine_id,
        "extra": ktc.kv_connector_extra_config,
    }


def check(argv: list[str]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except (Exception, SystemExit) as exc:  # argparse exits on a bad flag
        return {"stage": "parse", "error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {
        "parsed": transfer(engine_args.kv_transfer_config),
        "kv_offloading_size": engine_args.kv_offloading_size,
        "kv_offloading_backend": engine_args.kv_offloading_backend,
    }
    try:
        config = engine_args.create_engine_config()
    except Exception as exc:
        out.update(stage="config", error=f"{type(exc).__name__}: {exc}")
        return out
    out["ok"] = True
    out["resolved"] = transfer(config.kv_transfer_config)
    return out


def main() -> None:
    cases = json.load(sys.stdin)
    print(json.dumps([check(argv) for argv in cases]))


if __name__ == "__main__":
    main()
