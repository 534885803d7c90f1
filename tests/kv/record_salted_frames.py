"""Write ``data/kv-events-salted.jsonl``: real vLLM 0.32 KV event frames of salted prompts.

Run with the real-vLLM venv and the tiny model (``.ci/steps/20-vllm-venv.sh`` builds both)::

    .venv-vllm/bin/python tests/kv/record_salted_frames.py .venv-vllm/tiny > tests/kv/data/kv-events-salted.jsonl

It starts vLLM (CPU, block size 32, KV events on a free port) and sends, with ``temperature 0``
and one output token each, the same 100-token-id prompt ``P`` three times: without a
``cache_salt``, with ``cache_salt="tenant-a"`` and with ``"tenant-b"``, then a prompt that
shares P's first two blocks with ``"tenant-a"``. One line per frame, as the other recordings.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import zmq

P = [1] + [(i * 37) % 4000 + 10 for i in range(99)]
SHARED = P[:64] + [(i * 11) % 4000 + 10 for i in range(40)]
REQUESTS = [(P, None), (P, "tenant-a"), (P, "tenant-b"), (SHARED, "tenant-a")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict[str, object]) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def main(model: str) -> None:
    port, zport = free_port(), free_port()
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{zport}",
        "topic": "kv-events",
    }
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--max-model-len", "2048", "--enable-prefix-caching", "--block-size", "32", "--enforce-eager"]
    argv += ["--kv-cache-memory-bytes", "67108864", "--kv-events-config", json.dumps(cfg)]
    engine = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{zport}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or engine.poll() is not None:
                    raise SystemExit("vLLM did not start") from None
                time.sleep(0.5)
        time.sleep(1.0)  # the SUB socket connects before the first publish
        for prompt, salt in REQUESTS:
            body: dict[str, object] = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
            if salt is not None:
                body["cache_salt"] = salt
            post(f"http://127.0.0.1:{port}/v1/completions", body)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            if sub.poll(200):
                topic, seq, payload = sub.recv_multipart()
                rec = {
                    "topic": topic.decode(),
                    "seq": int.from_bytes(seq, "big"),
                    "payload_len": len(payload),
                    "payload_hex": payload.hex(),
                }
                sys.stdout.write(json.dumps(rec) + "\n")
    finally:
        engine.terminate()
        engine.wait(30)


if __name__ == "__main__":
    main(sys.argv[1])
