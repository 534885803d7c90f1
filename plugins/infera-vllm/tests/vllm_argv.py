"""Shared by the scripts that run under the real vLLM venv (``vllm_parse_check.py``,
``vllm_offload_check.py``): argv lists in as JSON on stdin, each parsed by vLLM's own server
parser, one JSON list of results out. Not a test module (no ``test_`` prefix)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable
from typing import Any


def engine_args(argv: list[str]) -> Any:
    """vLLM's ``AsyncEngineArgs`` for ``argv`` (what follows ``vllm serve``), or the error
    vLLM raised (argparse exits on a bad flag) as ``"<Type>: <message>"``."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        return AsyncEngineArgs.from_cli_args(args)
    except (Exception, SystemExit) as exc:
        return f"{type(exc).__name__}: {exc}"


def check_each(check: Callable[[list[str]], dict[str, Any]]) -> None:
    """Read a JSON list of argv lists on stdin; print one JSON list of ``check(argv)``."""
    cases = json.load(sys.stdin)
    print(json.dumps([check(argv) for argv in cases]))
