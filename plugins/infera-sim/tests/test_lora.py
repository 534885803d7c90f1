"""The sim serves LoRA adapters as vLLM 0.32 does (``--lora-modules name=path``): an adapter's
prompt has its own cache, and its KV events carry ``lora_name``, ``lora_id`` and the adapter's
name leading every block's ``extra_keys`` (the salt after it on a prompt's first block), so the
router roots the chain in the adapter."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from infera_sim.config import parse_args
from infera_sim.kv_publisher import encode_batch
from infera_sim.kvcache import KvCache, block_hashes, salt_root
from infera_sim.testing import start_sim

from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import BlockStored
from infera_core.kv.hashing import namespace_root, py_chain_hashes
from infera_core.kv.index import KvIndex

BS = 16
TOKENS = list(range(100, 100 + 3 * BS))
SQL = ("sql-lora", 1)


def test_an_adapters_runs_carry_its_name_as_vllm_publishes_them() -> None:
    cache = KvCache(8, BS)
    hashes = block_hashes(TOKENS, BS, parent=salt_root("s", SQL))
    assert hashes != block_hashes(TOKENS, BS, parent=salt_root("s"))
    assert block_hashes(TOKENS, BS, parent=salt_root(None, SQL)) != block_hashes(TOKENS, BS)
    blocks = cache.allocate(3)
    cache.commit(blocks, 0, hashes[:2], None, TOKENS[: 2 * BS], "s", SQL)
    cache.commit(blocks, 2, hashes[2:], hashes[1], TOKENS[2 * BS :], "s", SQL)
    first, rest = cache.events
    assert isinstance(first, BlockStored) and isinstance(rest, BlockStored)
    assert (first.lora_name, first.lora_id) == SQL and first.extra_keys == [["sql-lora", "s"], ["sql-lora"]]
    assert rest.extra_keys == [["sql-lora"]]
    # the router's index, fed the wire frame, roots them in the adapter (and the salt): only that namespace matches
    index = KvIndex()
    view = index.add_view("w", None, BS)
    index.apply(view, MsgpackEventDecoder("vllm").decode_raw(encode_batch(0.0, [first, rest], None, "map")))

    def matched(lora: str | None, salt: str | None) -> float:
        hashes = py_chain_hashes(TOKENS, BS, namespace_root(lora, salt))
        return index.match(hashes, [view])[0]

    assert matched("sql-lora", "s") == 3
    assert matched(None, "s") == matched("sql-lora", None) == matched("other", "s") == 0


def test_adapter_requests_use_their_own_cache() -> None:
    prompt = " ".join(f"w{i}" for i in range(200))
    with start_sim(
        speedup="inf", block_size=BS, kv_events_port=None, kv_replay_port=None, lora_modules=["sql-lora=/a"]
    ) as sim:

        def cached(model: str) -> int:
            body = {"model": model, "prompt": prompt, "max_tokens": 1}
            r = httpx.post(sim.url + "/v1/completions", json=body, timeout=10)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model
            return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert cached("sim-model") == 0
        assert cached("sql-lora") == 0  # not the base model's prefix
        assert cached("sql-lora") > 0
        assert cached("sim-model") > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora-modules", "no-path"], "expected name=path"),
        (["--lora-modules", '{"name": "x"}'], "JSON needs 'name' and 'path'"),
        (["--model", "m", "--lora-modules", "m=/p"], "cannot have the served model's name"),
    ],
)
def test_bad_lora_modules_are_one_clear_line(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "infera_sim.server", *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_lora_modules_take_vllms_forms() -> None:
    cfg = parse_args(["--lora-modules", "a=/p/a", '{"name": "b", "path": "/p/b", "base_model_name": "m"}'])
    assert cfg.lora_modules == {"a": "/p/a", "b": "/p/b"}
