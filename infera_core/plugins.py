"""Moved to :mod:`infera_core.plugin.loader`; this re-export stays for one release."""

from infera_core.plugin.loader import (
    ENTRY_POINT_GROUP,
    PluginInfo,
    PluginManager,
    Status,
    make_plugin_manager,
)

__all__ = ["ENTRY_POINT_GROUP", "PluginInfo", "PluginManager", "Status", "make_plugin_manager"]
