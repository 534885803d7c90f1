"""Moved to :mod:`infera_core.up.compare`; this re-export stays for one release."""

from infera_core.up.compare import run_targets

__all__ = ["run_targets"]
