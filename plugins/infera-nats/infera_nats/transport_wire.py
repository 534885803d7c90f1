"""The NATS request transport's wire format: subjects and message framing (router ⇄ responder).

Subjects (``prefix`` defaults to ``infera``):

* ``<prefix>.req.<worker>`` — requests to one worker (its responders subscribe in the
  queue group ``infera``, so a second responder for the same worker shares the load
  instead of doubling it);
* ``<prefix>.req.<worker>.cancel`` — cancel messages (every responder of the worker);
* the reply subject of each request: ``<router inbox>.<n>`` (one wildcard subscription per
  router process).

``<worker>`` is the worker id with every character outside ``[A-Za-z0-9_-]`` written as
``%XX`` (dots separate subject tokens in NATS), so two ids never share a subject.

A request is one message: ``<path>\\n<Header>: <value>\\n…\\n\\n<body>``. The response is a
sequence of messages to the reply subject, each ``<kind:1><seq:4 BE><rest>`` with ``seq``
0, 1, 2… per response (a gap means messages were dropped: the response fails):

* ``H`` head — rest: ``<status> <content-type>\\n<Header>: <value>\\n…\\n\\n<first body bytes>``;
* ``F`` head of a response complete in this one message (same layout);
* ``D`` body bytes; ``E`` the end (rest: the last body bytes, possibly none);
* ``X`` failure — rest: the reason (UTF-8). Before the head: the worker's engine could not
  be reached (retryable); after it: the response broke mid-body.

A cancel message's payload is the reply subject of the request to abandon.
"""

from __future__ import annotations

# the subject names are the permission layout's (one definition for both)
from infera_core.util.nats_layout import QUEUE_GROUP as QUEUE_GROUP
from infera_core.util.nats_layout import cancel_subject as cancel_subject
from infera_core.util.nats_layout import request_subject as request_subject
from infera_core.util.nats_layout import subject_token as subject_token

HEAD = 0x48  # H
FULL = 0x46  # F
DATA = 0x44  # D
END = 0x45  # E
FAIL = 0x58  # X

HOP_BY_HOP = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


def frame(kind: int, seq: int, rest: bytes = b"") -> bytes:
    return bytes((kind,)) + seq.to_bytes(4, "big") + rest


def _clean(value: str) -> str:
    return value.replace("\r", " ").replace("\n", " ") if "\n" in value or "\r" in value else value


def encode_request(path: str, headers: dict[str, str] | None, body: bytes) -> bytes:
    lines = [path]
    if headers:
        lines.extend(f"{k}: {_clean(v)}" for k, v in headers.items())
    return ("\n".join(lines) + "\n\n").encode("latin-1", "replace") + body


def decode_request(data: bytes) -> tuple[str, dict[str, str], bytes]:
    """(path, headers, body); ``ValueError`` when the message is not a request."""
    end = data.find(b"\n\n")
    if end < 0:
        raise ValueError("no header terminator")
    head = data[:end].decode("latin-1").split("\n")
    path = head[0]
    if not path.startswith("/"):
        raise ValueError(f"bad path {path[:80]!r}")
    headers: dict[str, str] = {}
    for line in head[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"bad header line {line[:80]!r}")
        headers[name.strip()] = value.strip()
    return path, headers, data[end + 2 :]


def encode_head(status: int, content_type: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The head block of an ``H``/``F`` message (hop-by-hop and Content-Type headers left out)."""
    parts = [b"%d %s\n" % (status, content_type.encode("latin-1", "replace"))]
    for k, v in headers:
        lk = k.lower()
        if lk == b"content-type" or lk.decode("latin-1") in HOP_BY_HOP:
            continue
        parts.append(k + b": " + v.replace(b"\n", b" ").replace(b"\r", b" ") + b"\n")
    parts.append(b"\n")
    return b"".join(parts)


def decode_head(rest: bytes) -> tuple[int, str, bytes, bytes]:
    """(status, content type, raw header lines, first body bytes) of an ``H``/``F`` message."""
    line_end = rest.find(b"\n")
    end = rest.find(b"\n\n", line_end)
    if line_end < 0 or end < 0:
        raise ValueError("truncated response head")
    status_s, _, ctype = rest[:line_end].partition(b" ")
    status = int(status_s)
    if not 100 <= status <= 999:
        raise ValueError(f"bad status {status}")
    return status, ctype.decode("latin-1"), rest[line_end + 1 : end + 1], rest[end + 2 :]


def find_header(raw: bytes, name: str) -> str | None:
    """A header's value in a head block's raw lines (case-insensitive name)."""
    key = name.lower()
    for line in raw.decode("latin-1").split("\n"):
        k, sep, v = line.partition(":")
        if sep and k.strip().lower() == key:
            return v.strip()
    return None
