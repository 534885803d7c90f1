"""Moved to :mod:`infera_core.engines.settings`; this re-export stays for one release."""

from infera_core.engines.settings import LEGACY_ENV, RestartPolicy, WorkerSettings, with_legacy_env

__all__ = ["LEGACY_ENV", "RestartPolicy", "WorkerSettings", "with_legacy_env"]
