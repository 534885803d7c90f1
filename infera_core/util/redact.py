"""Credential redaction: the one helper every log line and JSON answer that shows a URL uses.

Worker URLs may carry credentials (``http://admin:hunter2@10.0.0.5:8000``, a
``?token=…`` query). :func:`redact_url` keeps what an operator needs to find the
worker (scheme, host, port, path) and replaces the secrets with ``***``.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import SplitResult, urlsplit

MASK = "***"


@lru_cache(maxsize=4096)
def redact_url(url: str) -> str:
    """``url`` without secrets: user info → ``***``, every query value → ``***``.

    A string that does not parse as a URL is returned with everything before an ``@``
    masked (``user:pw@host`` → ``***@host``), so nothing slips through unparsed.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:
        return _mask_userinfo(url)
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        query = "&".join((kv.split("=", 1)[0] + "=" + MASK) if "=" in kv else kv for kv in query.split("&"))
    if netloc == parts.netloc and query == parts.query:
        return url if parts.netloc or "@" not in url else _mask_userinfo(url)
    return SplitResult(parts.scheme, netloc, parts.path, query, parts.fragment).geturl()


def _mask_userinfo(text: str) -> str:
    if "@" not in text:
        return text
    head, tail = text.rsplit("@", 1)
    scheme = head.split("://", 1)[0] + "://" if "://" in head else ""
    return f"{scheme}{MASK}@{tail}"
