"""The worker and options of the SGLang golden-argv tests (ports and options per test file)."""

from __future__ import annotations

SGLANG_WORKER: dict[str, object] = {
    "worker_id": "s1",
    "model": "qwen",
    "model_path": "/models/qwen",
    "host": "0.0.0.0",
    "port": 30000,
    "advertise_host": "10.0.0.7",
}
SGLANG_OPTIONS: dict[str, object] = {
    "page_size": 16,
    "tp": 1,
    "transfer_backend": "mooncake",
    "kv_events_port": 0,
}
