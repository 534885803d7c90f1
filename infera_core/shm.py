"""Moved to :mod:`infera_core.util.shm`; this re-export stays for one release."""

from infera_core.util.shm import *  # noqa: F403
