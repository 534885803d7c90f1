"""Moved to :mod:`infera_core.util.shm`; this re-export stays for one release."""

from infera_core.util.shm import name_hash, shared_memory

__all__ = ["name_hash", "shared_memory"]
