"""Settings of pluggable backends: each discovery backend and transport owns a pydantic model.

A discovery backend, request transport or KV-event transport may declare
``settings_model``: a pydantic model (usually an :class:`~infera_core.config.settings.InferaSettings`
subclass, so its fields read ``INFERA_<FIELD>`` from the environment). The commands that
take backend flags (``serve``, ``worker <engine>``, ``up``, ``workers``) add one option per
field of every installed backend's model (:func:`backend_models` +
:func:`infera_core.config.settings.compose_settings`), so a plugin's flags show in ``--help`` and
are validated by pydantic like core's own.

At run time a backend reads its settings with ``options.get(MyModel)`` where ``options``
is a :class:`BackendOptions` handed to it (``DiscoverySettings.options``,
``ClientContext.options``, ``WorkerContext.options``…). Two backends of one plugin may
share a model (the NATS plugin's three registrations all use ``NatsSettings``): each
field becomes one flag.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from infera_core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class BackendOptions:
    """Resolves backend settings models from one command's settings object.

    ``source`` is the resolved command settings (built from a model composed with the
    backends' fields, so it has them as attributes); fields it lacks take their value
    from the environment (``INFERA_*``) or the model's default. ``given`` are ready
    instances that win over everything (tests, embedding code).
    """

    __slots__ = ("_cache", "source")

    def __init__(self, source: object | None = None, given: Iterable[BaseModel] = ()) -> None:
        self.source = source
        self._cache: dict[type[BaseModel], BaseModel] = {type(m): m for m in given}

    def get(self, model: type[M]) -> M:
        """The instance of ``model`` for this command (built once, then cached)."""
        found = self._cache.get(model)
        if found is None:
            values: dict[str, Any] = {}
            if self.source is not None:
                fields_set = getattr(self.source, "model_fields_set", None)
                for name in model.model_fields:
                    if hasattr(self.source, name) and (fields_set is None or name in fields_set):
                        values[name] = getattr(self.source, name)
            try:
                found = model(**values)
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(map(str, err.get("loc") or ("?",)))
                raise ConfigError(f"{model.__name__}: {loc}: {err.get('msg')}") from None
            self._cache[model] = found
        assert isinstance(found, model)
        return found

    def __repr__(self) -> str:
        return f"BackendOptions({[m.__name__ for m in self._cache]})"


def settings_model_of(obj: object) -> type[BaseModel] | None:
    """A backend's ``settings_model`` (None when it declares none)."""
    model = getattr(obj, "settings_model", None)
    if model is None:
        return None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{type(obj).__name__}.settings_model must be a pydantic model class, got {model!r}")
    return model
