"""Moved to :mod:`infera_core.config.backends`; this re-export stays for one release."""

from infera_core.config.backends import BackendOptions, settings_model_of
from infera_core.plugin.settings import backend_models, with_backend_fields

__all__ = ["BackendOptions", "backend_models", "settings_model_of", "with_backend_fields"]
