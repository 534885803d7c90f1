"""Router configuration: a default profile (preset or explicit) plus per-model overrides.

``--router-policy NAME`` selects a preset; ``--router-config FILE`` reads YAML such as::

    preset: least-load            # or an explicit profile:
    # filters: [{name: health}]
    # scorers: [{name: least-load, weight: 1}]
    # picker: {name: max-score}
    models:
      big-model: {preset: session-affinity}
      small-model:
        filters: [{name: health}]
        picker: {name: round-robin}
      long-model: {migration_limit: 3}   # its streams may move 3 times (--migration-limit)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infera_core.errors import ConfigError, UnknownNameError
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.registry import PolicyRegistry

PREFERRED_POLICY = "kv-aware"
"""The preset ``serve`` and ``up`` use when none is given and a plugin provides it."""
FALLBACK_POLICY = "round-robin"
"""The core preset used otherwise."""


def default_policy(registry: PolicyRegistry) -> str:
    """``kv-aware`` when an installed plugin (infera-policies) provides it, else ``round-robin``."""
    return PREFERRED_POLICY if PREFERRED_POLICY in registry.preset_names() else FALLBACK_POLICY


class ProfileChoice(BaseModel):
    """Either ``preset`` or an explicit profile (``filters``/``scorers``/``picker``)."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = None
    filters: list[PluginRef] | None = None
    scorers: list[ScorerRef] | None = None
    picker: PluginRef | None = None

    def resolve(self, registry: PolicyRegistry, where: str) -> tuple[str, ProfileConfig]:
        """(label, profile) — the label names the preset, or ``custom``."""
        explicit = self.filters is not None or self.scorers is not None or self.picker is not None
        if self.preset is not None:
            if explicit:
                raise ConfigError(f"{where}: give either 'preset' or filters/scorers/picker, not both")
            try:
                return self.preset, registry.preset(self.preset).profile
            except UnknownNameError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        profile = ProfileConfig(filters=self.filters or [], scorers=self.scorers or [])
        if self.picker is not None:
            profile.picker = self.picker
        return "custom", profile


class ModelChoice(ProfileChoice):
    """One model's overrides: its profile, and how often its streams may migrate."""

    migration_limit: int | None = Field(None, ge=0)
    """``--migration-limit`` for this model (None: the flag's)."""

    @property
    def has_profile(self) -> bool:
        return (
            self.preset is not None
            or self.filters is not None
            or self.scorers is not None
            or (self.picker is not None)
        )


class RouterConfig(ProfileChoice):
    """The whole routing configuration."""

    models: dict[str, ModelChoice] = Field(default_factory=dict)
    pd: dict[str, Any] | None = None
    """Prefill/decode disaggregation (``mode``, ``prefill``, ``decode``, ``models``…), parsed by
    :mod:`infera_core.scheduling.pd`."""


def load_router_config(path: str | Path) -> RouterConfig:
    p = Path(path)
    try:
        data: Any = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"--router-config {p}: cannot read file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--router-config {p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"--router-config {p}: expected a mapping (preset / filters / scorers / picker / models)"
        )
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise ConfigError(f"--router-config {p}: {loc}: {err.get('msg')}") from None
