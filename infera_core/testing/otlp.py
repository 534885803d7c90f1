"""An OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` (protobuf, gzip or not) on
127.0.0.1, every span it gets kept as a :class:`ReceivedSpan`.

Needs ``opentelemetry-proto`` (the ``tracing`` extra); imported when a receiver starts.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from infera_core.testing.http_handler import QuietHandler


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    """The spans received so far (``spans``), the URL to export to (``url``)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        self.url = ""

    def add(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        out: list[ReceivedSpan] = []
        for rs in req.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        ReceivedSpan(
                            service,
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            int(s.kind),
                            {a.key: _value(a.value) for a in s.attributes},
                        )
                    )
        with self.lock:
            self.spans.extend(out)

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Run a receiver until the block exits."""
    receiver = OtlpReceiver()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            receiver.add(body)
            self.reply(200, b"", "application/x-protobuf")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
