"""Credential redaction: the one helper every log line and JSON answer that shows a URL uses.

Worker URLs may carry credentials (``http://admin:hunter2@10.0.0.5:8000``, a
``?token=…`` query, a bare ``?s3cr3t`` query, a ``#access_token=…`` fragment, a
``;jsessionid=…`` path parameter). :func:`redact_url` keeps what an operator needs to
find the worker (scheme, host, port, path, the names of parameters) and replaces every
secret with ``***``.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import SplitResult, urlsplit

MASK = "***"


@lru_cache(maxsize=4096)
def redact_url(url: str) -> str:
    """``url`` without secrets: user info → ``***``; every query or fragment value → ``***``
    (names kept: ``?token=***``), a bare query or fragment item → ``***``; every path
    parameter's value (``;jsessionid=***``) → ``***``.

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
    path = "/".join(_mask_params(seg) for seg in parts.path.split("/")) if ";" in parts.path else parts.path
    query, fragment = _mask_items(parts.query), _mask_items(parts.fragment)
    if (netloc, path, query, fragment) == (parts.netloc, parts.path, parts.query, parts.fragment):
        return url if parts.netloc or "@" not in url else _mask_userinfo(url)
    return SplitResult(parts.scheme, netloc, path, query, fragment).geturl()


def _mask_items(text: str) -> str:
    """``a=1&b&c=2`` → ``a=***&***&c=***`` (a bare item may be a token itself)."""
    if not text:
        return text
    items = text.replace(";", "&").split("&")
    return "&".join((kv.split("=", 1)[0] + "=" + MASK) if "=" in kv else (MASK if kv else kv) for kv in items)


def _mask_params(segment: str) -> str:
    """One path segment with its ``;name=value`` parameters' values masked."""
    if ";" not in segment:
        return segment
    head, *params = segment.split(";")
    return ";".join([head, *((p.split("=", 1)[0] + "=" + MASK) if "=" in p else MASK for p in params)])


def _mask_userinfo(text: str) -> str:
    if "@" not in text:
        return text
    head, tail = text.rsplit("@", 1)
    scheme = head.split("://", 1)[0] + "://" if "://" in head else ""
    return f"{scheme}{MASK}@{tail}"
