"""A PD pair must be the same engine speaking the same protocol (infera_core.engines.pd.check_pair)."""

from __future__ import annotations

import pytest

from infera_core.engines.pd import PdPairError, check_pair
from infera_core.worker import PdInfo, Role, WorkerRecord


def rec(wid: str, engine: str, role: Role, protocol: str | None, model: str = "m") -> WorkerRecord:
    pd = PdInfo(protocol=protocol) if protocol else None
    return WorkerRecord(worker_id=wid, url=f"http://{wid}:1", model=model, engine=engine, role=role, pd=pd)


def test_same_engine_and_protocol_pairs() -> None:
    check_pair(rec("p", "vllm", Role.PREFILL, "vllm-nixl"), rec("d", "vllm", Role.DECODE, "vllm-nixl"))


def test_mixed_engines_are_refused_naming_both_workers() -> None:
    with pytest.raises(PdPairError, match=r"prefill p1 runs vllm but decode d1 runs sglang.*same engine"):
        check_pair(
            rec("p1", "vllm", Role.PREFILL, "vllm-nixl"), rec("d1", "sglang", Role.DECODE, "sglang-bootstrap")
        )


def test_different_connectors_of_one_engine_are_refused() -> None:
    with pytest.raises(PdPairError, match=r"vllm-nixl.*vllm-mooncake"):
        check_pair(
            rec("p", "vllm", Role.PREFILL, "vllm-nixl"), rec("d", "vllm", Role.DECODE, "vllm-mooncake")
        )


def test_worker_without_pd_protocol_is_refused() -> None:
    with pytest.raises(PdPairError, match="no PD protocol"):
        check_pair(rec("p", "atom", Role.PREFILL, "atom-mooncake"), rec("d", "atom", Role.DECODE, None))


def test_different_models_are_refused() -> None:
    with pytest.raises(PdPairError, match=r"serves 'a'.*serves 'b'"):
        check_pair(
            rec("p", "sglang", Role.PREFILL, "sglang-bootstrap", "a"),
            rec("d", "sglang", Role.DECODE, "sglang-bootstrap", "b"),
        )
