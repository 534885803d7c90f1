"""Moved to :mod:`infera_core.config.settings`; this re-export stays for one release."""

from infera_core.config.settings import (
    InferaSettings,
    click_options,
    compose_settings,
    config_option,
    env_name,
    field_options,
    read_config_file,
    read_data_file,
    resolve,
)
from infera_core.plugin.settings import SettingsCommand, command_settings

__all__ = [
    "InferaSettings",
    "SettingsCommand",
    "click_options",
    "command_settings",
    "compose_settings",
    "config_option",
    "env_name",
    "field_options",
    "read_config_file",
    "read_data_file",
    "resolve",
]
