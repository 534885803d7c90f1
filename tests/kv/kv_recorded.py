"""Real vLLM 0.32 KV event frames recorded on this machine (copied from shared/reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"


def frames(name: str) -> list[dict[str, Any]]:
    """Lines of ``data/kv-events-<name>.jsonl``: seq, topic, payload (bytes), batch (decoded JSON)."""
    out = []
    for line in (DATA / f"kv-events-{name}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["payload"] = bytes.fromhex(rec["payload_hex"])
        out.append(rec)
    return out


RECORDINGS = ("prefix-sharing", "evict-and-clear")
