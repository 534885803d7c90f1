"""The replay side of vLLM's ZMQ KV-event protocol, shared by every publisher Infera runs
(the launcher's poller for engines that hand events out, the simulator).

A subscriber that missed events sends ``[identity, b"", start_seq (8 bytes, big-endian)]``
to the publisher's ROUTER socket; the publisher answers every buffered batch from
``start_seq`` on as ``[identity, b"", topic, seq, payload]`` and then an end frame with
sequence ``-1`` (:data:`END_SEQ`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay."""


async def serve_replay(
    sock: zmq.asyncio.Socket,
    topic: bytes,
    buffered: Callable[[], Iterable[tuple[int, bytes]]],
    on_invalid: Callable[[int], None] | None = None,
) -> None:
    """Answer replay requests on the ROUTER ``sock`` forever from ``buffered()`` (``(seq,
    payload)`` pairs, oldest first); ``on_invalid(frame_count)`` hears of malformed requests."""
    while True:
        frames = await sock.recv_multipart()
        if len(frames) != 3:
            if on_invalid is not None:
                on_invalid(len(frames))
            continue
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in buffered():
            if seq >= start_seq:
                await sock.send_multipart([client, b"", topic, seq.to_bytes(8, "big"), payload])
        await sock.send_multipart([client, b"", b"", END_SEQ, b""])
