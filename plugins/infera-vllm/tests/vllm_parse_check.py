"""Run under the real vLLM venv: parse argv lists with vLLM's own server parser.

Reads a JSON list of argv lists (each after ``vllm serve``) on stdin; prints one JSON
object per argv: the ``KVTransferConfig`` vLLM built (or the error it raised), each
MultiConnector child rebuilt the way vLLM's MultiConnector does, the connector class
vLLM's factory resolves, and MoRIIO's mode. Not a test module (no ``test_`` prefix).
"""

from __future__ import annotations

from typing import Any

from vllm_argv import check_each, engine_args


def connector_class(ktc: Any) -> str:
    """The class vLLM's factory resolves for ``ktc`` (by its registered name when the
    connector's optional dependencies, e.g. MoRI-IO's ``msgpack``/``mori``, are not installed)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        return str(KVConnectorFactory.get_connector_class(ktc).__name__)
    except ModuleNotFoundError:
        if ktc.kv_connector in KVConnectorFactory._registry:
            return str(ktc.kv_connector)
        raise


def check(argv: list[str]) -> dict[str, Any]:
    from vllm.config import KVTransferConfig

    parsed = engine_args(argv)
    if isinstance(parsed, str):
        return {"error": parsed}
    ktc = parsed.kv_transfer_config
    out: dict[str, Any] = {"ok": True, "kv_transfer_config": None}
    if ktc is None:
        return out
    out["kv_transfer_config"] = {
        "kv_connector": ktc.kv_connector,
        "kv_role": ktc.kv_role,
        "engine_id": ktc.engine_id,
        "is_kv_producer": ktc.is_kv_producer,
        "is_kv_consumer": ktc.is_kv_consumer,
        "extra": ktc.kv_connector_extra_config,
    }
    out["connector_class"] = connector_class(ktc)
    children = []
    for child in (
        ktc.kv_connector_extra_config.get("connectors", []) if ktc.kv_connector == "MultiConnector" else []
    ):
        # what vllm's MultiConnector._get_connector_classes_and_configs does
        built = KVTransferConfig(**child, engine_id=ktc.engine_id)
        children.append(
            {
                "kv_connector": built.kv_connector,
                "kv_role": built.kv_role,
                "is_kv_producer": built.is_kv_producer,
                "class": connector_class(built),
            }
        )
    out["children"] = children
    if ktc.kv_connector == "MoRIIOConnector":
        from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_common import get_moriio_mode

        out["moriio_mode"] = get_moriio_mode(ktc).name
    return out


if __name__ == "__main__":
    check_each(check)
