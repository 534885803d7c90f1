"""Memory shared by the processes of one ``serve --processes N`` (mapped before they fork)."""

from __future__ import annotations

import hashlib
import mmap
import os
import tempfile


def shared_memory(name: str, size: int) -> tuple[int, mmap.mmap]:
    """A zeroed mapping of ``size`` bytes, and its file descriptor (for ``fcntl`` locks); an
    anonymous memory file on Linux, an unlinked temporary file elsewhere. Pages are
    allocated when first written."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name)
    else:
        fd, path = tempfile.mkstemp(prefix=f"{name}-")
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


def name_hash(name: str) -> tuple[int, int]:
    """Two signed 64-bit words naming ``name`` in a shared table; never ``(0, 0)`` (a free slot)."""
    digest = hashlib.blake2b(name.encode(), digest_size=16).digest()
    h1 = int.from_bytes(digest[:8], "little", signed=True)
    h2 = int.from_bytes(digest[8:], "little", signed=True) or 1
    return h1, h2
