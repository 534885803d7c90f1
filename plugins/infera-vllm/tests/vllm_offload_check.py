"""Run under the real vLLM venv: resolve offloading argv lists with vLLM's own parser and config.

Reads a JSON list of argv lists (each after ``vllm serve``) on stdin; for each, parses it
with vLLM's server parser and builds the engine config (``create_engine_config``: the
step that turns ``--kv-offloading-size`` into a connector). Prints one JSON list: per
argv the resolved ``KVTransferConfig`` and cache offloading fields, or the error vLLM
raised (``stage``: ``parse`` or ``config``). Not a test module (no ``test_`` prefix).
"""

from __future__ import annotations

from typing import Any

from vllm_argv import check_each, engine_args


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
    parsed = engine_args(argv)
    if isinstance(parsed, str):
        return {"stage": "parse", "error": parsed}
    out: dict[str, Any] = {
        "parsed": transfer(parsed.kv_transfer_config),
        "kv_offloading_size": parsed.kv_offloading_size,
        "kv_offloading_backend": parsed.kv_offloading_backend,
    }
    try:
        config = parsed.create_engine_config()
    except Exception as exc:
        out.update(stage="config", error=f"{type(exc).__name__}: {exc}")
        return out
    out["ok"] = True
    out["resolved"] = transfer(config.kv_transfer_config)
    return out


if __name__ == "__main__":
    check_each(check)
