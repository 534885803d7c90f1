"""Moved to :mod:`infera_core.util.net`; this re-export stays for one release."""

from infera_core.util.net import free_port, stop_process, wait_port

__all__ = ["free_port", "stop_process", "wait_port"]
