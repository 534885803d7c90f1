"""``bench --policies`` entries: a preset, a preset with changed parameters, or a router config.

* ``kv-aware``: the preset;
* ``kv-aware:kv-overlap.cpu=0:kv-overlap.disk=0``: the preset with parameters of its
  filters/scorers/picker changed (``NAME.weight=…`` sets a scorer's weight), taken from
  the installed preset at run time, so the variant never drifts from it;
* ``my-policy.yaml``: a router config file (``--router-config``), labelled by its stem.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infera_core.errors import ConfigError, UnknownNameError
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.registry import PolicyRegistry

CONFIG_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class PolicyVariant:
    """What one local stack of the comparison runs: a preset or a router config file."""

    label: str
    preset: str | None = None
    router_config: Path | None = None


def parse_variant(entry: str, registry: PolicyRegistry, workdir: Path) -> PolicyVariant:
    """One ``--policies`` entry (see the module doc); overrides are written to ``workdir``."""
    if entry.endswith(CONFIG_SUFFIXES):
        path = Path(entry)
        if not path.is_file():
            raise ConfigError(f"--policies: router config {entry} not found")
        return PolicyVariant(path.stem, router_config=path)
    name, *overrides = entry.split(":")
    if not overrides:
        return PolicyVariant(entry, preset=entry)
    try:
        profile = registry.preset(name).profile.model_copy(deep=True)
    except UnknownNameError as exc:
        raise ConfigError(f"--policies {entry}: {exc}") from None
    for item in overrides:
        _override(profile, item, entry)
    path = Path(tempfile.mkstemp(suffix=".yaml", dir=workdir)[1])
    data = profile.model_dump(mode="json", include={"filters", "scorers", "picker"})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return PolicyVariant(entry, router_config=path)


def _override(profile: ProfileConfig, item: str, entry: str) -> None:
    target, eq, raw = item.partition("=")
    plugin, dot, param = target.partition(".")
    if not eq or not dot or not plugin or not param:
        raise ConfigError(f"--policies {entry}: '{item}' is not NAME.PARAM=VALUE (e.g. kv-overlap.cpu=0)")
    refs: list[PluginRef] = [*profile.filters, *profile.scorers, profile.picker]
    found = [r for r in refs if r.name == plugin]
    if not found:
        names = ", ".join(r.name for r in refs)
        raise ConfigError(f"--policies {entry}: the preset has no '{plugin}' (it has {names})")
    value: Any = yaml.safe_load(raw)
    for ref in found:
        if param == "weight":
            if not isinstance(ref, ScorerRef) or not isinstance(value, int | float):
                raise ConfigError(f"--policies {entry}: weight is a number, for a scorer")
            ref.weight = float(value)
        else:
            ref.params[param] = value
