"""Run under the real vLLM venv: what vLLM 0.32 says about external-LB DP for each model.

Reads a JSON list of model directories on stdin; prints one JSON object per directory:
vLLM's own ``ModelConfig.is_moe`` and the error ``EngineArgs.create_engine_config`` raises
for ``--data-parallel-size 2 --data-parallel-rank 1 --data-parallel-external-lb`` (or
none). Not a test module (no ``test_`` prefix).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def check(model: str) -> dict[str, Any]:
    from vllm.engine.arg_utils import EngineArgs

    def args() -> EngineArgs:
        return EngineArgs(
            model=model,
            data_parallel_size=2,
            data_parallel_rank=1,
            data_parallel_external_lb=True,
            max_model_len=512,
            enforce_eager=True,
            skip_tokenizer_init=True,
        )

    out: dict[str, Any] = {"model": model}
    try:
        out["is_moe"] = bool(args().create_model_config().is_moe)
    except Exception as exc:
        out["is_moe"] = f"{type(exc).__name__}: {exc}"
    try:
        args().create_engine_config()
        out["error"] = None
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def main() -> None:
    for model in json.load(sys.stdin):
        print(json.dumps(check(model)), flush=True)


if __name__ == "__main__":
    main()
