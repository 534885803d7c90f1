"""vLLM's own server parser accepts every KV-transfer argv the adapter writes (run under the
real vLLM venv by ``vllm_parse_check.py``): each PD connector per role, MoRIIO's READ mode,
MultiConnector with CPU offloading, and MoRIIO under TP × DP. The argv themselves are checked
in ``tests/engines/test_transfer_config.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from infera_vllm.adapter import VllmAdapter
from real_vllm import vllm_check

from infera_core.engines.base import LaunchContext
from infera_core.testing.engine_env import GOLDEN_WORKER, launch_context
from infera_core.worker import Role

NIXL_CLASSES = ("NixlConnector", "NixlPullConnector")
"""vLLM 0.32's factory resolves the name NixlConnector to its NixlPullConnector class."""
OFFLOAD = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"cpu_bytes_to_use": 1000000}}


def ctx(role: Role, **options: Any) -> LaunchContext:
    return launch_context(GOLDEN_WORKER, 41000, role=role, options={"tp": 1, **options})


def vllm_cases() -> list[tuple[str, LaunchContext]]:
    multi_nixl = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [{"kv_connector": "NixlConnector"}, OFFLOAD]},
    }
    multi_moriio = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [{"kv_connector": "MoRIIOConnector"}, OFFLOAD]},
    }
    read = {"kv_connector": "MoRIIOConnector", "kv_connector_extra_config": {"read_mode": True}}
    cases: list[tuple[str, LaunchContext]] = []
    for role in (Role.PREFILL, Role.DECODE):
        for name in ("nixl", "mooncake", "moriio"):
            cases.append((f"{name}-{role.value}", ctx(role, pd_connector=name)))
        cases.append((f"moriio-read-{role.value}", ctx(role, kv_transfer_config=json.dumps(read))))
        cases.append((f"multi-nixl-{role.value}", ctx(role, kv_transfer_config=json.dumps(multi_nixl))))
        cases.append((f"multi-moriio-{role.value}", ctx(role, kv_transfer_config=json.dumps(multi_moriio))))
    cases.append(("moriio-tp2-dp", ctx(Role.DECODE, pd_connector="moriio", tp=2, dp_size=2, dp_rank=1)))
    return cases


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_parser_accepts_every_transfer_argv() -> None:
    cases = vllm_cases()
    argvs = [["--model", "/models/tiny", *VllmAdapter().engine_flags(c)] for _, c in cases]
    results = vllm_check("vllm_parse_check.py", argvs, timeout=240)
    for (name, c), got in zip(cases, results, strict=True):
        assert got.get("ok"), f"{name}: vLLM refused the argv: {got.get('error')}"
        ktc = got["kv_transfer_config"]
        producer = c.role is Role.PREFILL
        assert ktc["engine_id"] == "w1", name
        if name.startswith("multi"):
            assert got["connector_class"] == "MultiConnector"
            pd_child, offload = got["children"]
            assert offload["class"] == "OffloadingConnector", name
            assert pd_child["class"] in (*NIXL_CLASSES, "MoRIIOConnector"), name
            if pd_child["class"] == "MoRIIOConnector":
                assert pd_child["is_kv_producer"] is producer, name
        else:
            classes = NIXL_CLASSES if ktc["kv_connector"] == "NixlConnector" else (ktc["kv_connector"],)
            assert got["connector_class"] in classes, name
        if "moriio" in name and not name.startswith("multi"):
            # MoRIIO: a producer only with kv_producer; WRITE unless read_mode
            assert ktc["is_kv_producer"] is producer and ktc["is_kv_consumer"] is not producer, name
            assert got["moriio_mode"] == ("READ" if "read" in name else "WRITE"), name
            for key in ("handshake_port", "notify_port", "http_port"):
                assert int(ktc["extra"][key]) > 0, name
