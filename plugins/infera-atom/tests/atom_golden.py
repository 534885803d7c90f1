"""The worker of the ATOM golden-argv tests (ports and options per test file)."""

from __future__ import annotations

ATOM_WORKER: dict[str, object] = {
    "worker_id": "a1",
    "model": "ds",
    "model_path": "/models/ds",
    "host": "0.0.0.0",
    "port": 8888,
    "advertise_host": "10.0.0.9",
    "discovery": "etcd",
}
