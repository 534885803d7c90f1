"""Registration-time agreement check: disagreeing workers are flagged and not credited."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from infera_core.errors import ConfigError
from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.plugin.hooks import InferaHooks
from infera_core.worker import KvEventsInfo, WorkerRecord

pytest.importorskip("infera_sim")


def _rec(worker_id: str, block_size: int = 16, vocab: int = 32000) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        url="http://127.0.0.1:9",
        model="sim-model",
        engine="sim",
        kv_events=KvEventsInfo(
            endpoint="tcp://127.0.0.1:9",
            format="vllm",
            block_size=block_size,
            fingerprint=f"infera-sim-v1:vocab={vocab}",
        ),
    )


def test_block_size_and_fingerprint_disagreements_are_flagged() -> None:
    registry = CollectorRegistry()
    settings = KvSettings(kv_block_size=["sim-model=16"])
    kv = KvRouting(InferaHooks.load().catalog(), settings, registry)
    kv.on_worker_added(_rec("good"))
    kv.on_worker_added(_rec("bs", block_size=32))
    kv.on_worker_added(_rec("vocab", vocab=4096))
    assert kv.worker_fields("good") == {"kv_mismatch": []}
    assert "block_size 32" in kv.worker_fields("bs")["kv_mismatch"][0]
    assert "fingerprint" in kv.worker_fields("vocab")["kv_mismatch"][0]
    assert kv.index.untrusted == {"bs", "vocab"}
    assert (
        registry.get_sample_value("infera_kv_worker_mismatch", {"worker": "bs", "reason": "block_size"}) == 1
    )
    # fixed record → flag cleared; removed worker → forgotten
    kv.on_worker_added(_rec("bs", block_size=16))
    kv.on_worker_removed(_rec("vocab"))
    assert kv.index.untrusted == set() and kv.agreement.flags == {}


def test_bad_kv_flags_are_config_errors() -> None:
    catalog = InferaHooks.load().catalog()
    with pytest.raises(ConfigError, match="--kv-block-size"):
        KvRouting(catalog, KvSettings(kv_block_size=["m=abc"]))
    with pytest.raises(ConfigError, match="--tokenizer m="):
        KvRouting(catalog, KvSettings(tokenizer=["m=hf:/no/such/dir"]))
