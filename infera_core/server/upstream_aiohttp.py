"""Moved to :mod:`infera_core.transports.http.aiohttp_upstream`; this re-export stays for one release."""

from infera_core.transports.http.aiohttp_upstream import JSON_HEADERS, AiohttpResponse, AiohttpUpstream

__all__ = ["JSON_HEADERS", "AiohttpResponse", "AiohttpUpstream"]
