"""TensorRT-LLM KV events: the ``trtllm`` decoder against events written the way TRT-LLM's
``KVCacheEventSerializer`` (``tensorrt_llm/_utils.py``) writes them, and the whole path —
``trtllm-serve`` (a stand-in serving ``POST /kv_cache_events`` as ``openai_server.py`` does:
each call takes the queued events) → the launcher's poll → the record's ZMQ endpoints.

``trtllm_kv_events.json`` is constructed from the serializer's source (no TRT-LLM runs here):
a ``created`` event, a stored chain of two full blocks and a partial one, a chain whose middle
block carries a ``token_extra_id``, an ``updated`` (GPU → host) and a ``removed``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import stat
import sys
from pathlib import Path

import msgspec
import pytest
import yaml
import zmq
import zmq.asyncio
from infera_openai.trtllm import TrtllmAdapter
from infera_openai.trtllm_events import TrtllmEventDecoder, decode_events

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.base import KvEventPoller
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import EngineError
from infera_core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvDecodeError
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.contracts import sample_launch_context

HERE = Path(__file__).parent
FIXTURE = json.loads((HERE / "trtllm_kv_events.json").read_text())
STANDIN = HERE / "trtllm_standin.py"
U64_MAX = (1 << 64) - 1


def test_the_serializers_events_normalize() -> None:
    batch = TrtllmEventDecoder().decode(json.dumps(FIXTURE).encode())
    assert batch.dp_rank is None
    cleared, first, second, removed = batch.events
    assert isinstance(cleared, AllBlocksCleared)  # "created": a new, empty cache
    # two full blocks of 4 (the partial third is no reusable prefix), chained from the root
    assert first == BlockStored([11, U64_MAX], None, [100, 101, 102, 103, 104, 105, 106, 107], 4, None, "GPU")
    # the block with a token_extra_id, and the one chained after it, are left out
    assert second == BlockStored([21], U64_MAX, [1, 2, 3, 4], 4, None, "GPU")
    assert removed == BlockRemoved([21])  # "updated" (a level change) is skipped


def test_attention_dp_rank_and_host_level() -> None:
    events = [dict(e, attention_dp_rank=1) for e in copy.deepcopy(FIXTURE[1:2])]
    events[0]["data"]["blocks"][1]["cache_level"] = 1  # the second block lives in host memory
    batch = decode_events(events)
    assert batch.dp_rank == 1
    gpu, host = batch.events
    assert isinstance(gpu, BlockStored) and isinstance(host, BlockStored)
    assert (gpu.block_hashes, gpu.medium) == ([11], "GPU")
    assert (host.block_hashes, host.parent_block_hash, host.medium) == ([U64_MAX], 11, "CPU")


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b"{", "not JSON"),
        (b'{"data": {}}', "JSON list"),
        (b'[{"event_id": 1}]', "without its data"),
        (b'[{"data": {"type": "moved"}}]', "unknown event type 'moved'"),
        (b'[{"data": {"type": "removed", "block_hashes": ["x"]}}]', "not an integer"),
        (
            b'[{"data": {"type": "created"}, "attention_dp_rank": 0},'
            b' {"data": {"type": "created"}, "attention_dp_rank": 1}]',
            "mixes attention DP ranks",
        ),
    ],
)
def test_bad_batches_are_decode_errors(payload: bytes, error: str) -> None:
    with pytest.raises(KvDecodeError, match=error):
        TrtllmEventDecoder().decode(payload)


def test_the_decoder_is_registered_under_the_records_format() -> None:
    hooks = InferaHooks.load()
    assert hooks.require("kv_event_decoder", "trtllm").name == "trtllm"


def test_record_and_llm_api_settings(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("max_batch_size: 8\nkv_cache_config:\n  free_gpu_memory_fraction: 0.5\n")
    adapter = TrtllmAdapter()
    assert isinstance(adapter, KvEventPoller)
    ctx = sample_launch_context(
        options={"trtllm_serve": sys.executable, "block_size": 64},
        engine_args=["--extra_llm_api_options", str(mine), "--backend", "pytorch"],
    )
    argv = adapter.build_launch(ctx).argv
    assert argv.count("--extra_llm_api_options") == 1 and str(mine) not in argv  # merged, not twice
    written = yaml.safe_load(Path(argv[argv.index("--extra_llm_api_options") + 1]).read_text())
    assert written == {
        "max_batch_size": 8,
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.5,
            "event_buffer_max_size": 16384,
            "tokens_per_block": 64,
        },
    }
    assert argv[-2:] == ["--backend", "pytorch"]
    kv = adapter.record_fields(ctx).kv_events
    assert kv is not None and (kv.format, kv.block_size, kv.topic) == ("trtllm", 64, "kv-events")
    off = sample_launch_context(options={"trtllm_serve": sys.executable, "kv_events": False})
    assert "--extra_llm_api_options" not in adapter.build_launch(off).argv
    assert adapter.record_fields(off).kv_events is None
    no_reuse = sample_launch_context(
        options={"trtllm_serve": sys.executable}, engine_args=["--disable_kv_cache_reuse"]
    )
    assert adapter.record_fields(no_reuse).kv_events is None  # TRT-LLM publishes none without reuse


def test_a_config_that_turns_block_reuse_off_is_one_line(tmp_path: Path) -> None:
    mine = tmp_path / "off.yaml"
    mine.write_text("kv_cache_config: {enable_block_reuse: false}\n")
    ctx = sample_launch_context(options={"trtllm_serve": sys.executable}, engine_args=["--config", str(mine)])
    with pytest.raises(EngineError, match=r"^kv_cache_config.enable_block_reuse: false: .*--no-kv-events$"):
        TrtllmAdapter().build_launch(ctx)


def standin_serve(tmp_path: Path) -> str:
    """An executable ``trtllm-serve`` that runs the stand-in with this interpreter."""
    path = tmp_path / "trtllm-serve"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_the_launcher_publishes_what_trtllm_serve_hands_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST /kv_cache_events`` is read by the launcher alone and published on the record's
    endpoints with sequence numbers: a subscriber gets the fixture's batch, replay returns it."""
    events_file = tmp_path / "events.json"
    events_file.write_text(json.dumps(FIXTURE))
    launcher = WorkerLauncher(
        InferaHooks.load(),
        "trtllm",
        WorkerSettings(model="tiny", model_path=str(tmp_path), worker_id="trt-0", drain_timeout=5),
        options={"trtllm_serve": standin_serve(tmp_path)},
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    monkeypatch.setenv("TRTLLM_STANDIN_EVENTS", str(events_file))
    task = asyncio.create_task(launcher.run())
    ctx = zmq.asyncio.Context()
    try:
        record = await launcher.wait_registered(within=60)
        kv = record.kv_events
        assert kv is not None and kv.format == "trtllm"
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(kv.endpoint)
        # the stand-in hands out its events only once the launcher's poll read the LLM API
        # settings that turn them on; a subscriber that joins late asks the replay socket
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(kv.replay_endpoint or "")
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not got and loop.time() < deadline:
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), 10)
                if int.from_bytes(frames[-2], "big", signed=True) == -1:
                    break
                assert frames[1] == b"kv-events" and int.from_bytes(frames[2], "big") == len(got)
                got.append(frames[3])
            if not got and await sub.poll(500):  # or it arrives live
                topic, seq, payload = await sub.recv_multipart()
                assert topic == b"kv-events" and int.from_bytes(seq, "big") == 0
                got.append(payload)
        assert got, "the launcher published no KV event batch"
        assert msgspec.json.decode(got[0]) == FIXTURE
        batch = TrtllmEventDecoder().decode(got[0])
        assert [type(e).__name__ for e in batch.events] == [
            "AllBlocksCleared",
            "BlockStored",
            "BlockStored",
            "BlockRemoved",
        ]
    finally:
        ctx.destroy(linger=0)
        await launcher.stop()
        await task
