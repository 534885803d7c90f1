"""The NATS plane's names and its per-role permission layout (who may publish and subscribe to what).

Subjects (``prefix`` defaults to ``infera``; ``<w>`` is a worker id as one subject token, see
:func:`subject_token`):

* ``<prefix>.req.<w>`` — requests to worker ``w`` (its responders: queue group ``infera``),
  ``<prefix>.req.<w>.cancel`` — their cancel messages; replies go to the router's inbox;
* ``<prefix>.kv.<model>.<w>[.r<rank>]`` — worker ``w``'s KV events, kept in the JetStream
  stream ``INFERA_KV``;
* ``$KV.<bucket>.<key>`` — worker records in the JetStream key-value bucket (``<key>``: the
  worker id, see :func:`bucket_key`); ``$KV.<bucket>_STATE.<name>`` — the routers' shared
  records (API-key budgets).

Roles (:func:`permissions`), each a NATS user with an allow list (anything else is refused
by the server, which tells the client and logs a permissions violation):

* ``router`` — publishes requests and cancels to every worker, reads the KV event stream
  and the record bucket (JetStream consumers), creates the stream and bucket when missing,
  reads and writes the shared-state bucket;
  subscribes only to its own inbox (``_INBOX.<user>.>``);
* ``worker:<w>`` (one user per worker: its launcher, responder and KV relay) — subscribes
  only to its own request and cancel subjects (requests only in the queue group), answers
  only the requests it received (``allow_responses``), publishes only its own KV event
  subjects and writes only its own record key;
* ``admin`` — everything (operators, the stack that started the server).

A client with no credentials cannot connect at all. :func:`server_config` writes the
nats-server configuration (JSON, which nats-server reads) for a set of users;
:func:`inbox_prefix` is the inbox a user's clients must use (``--nats-inbox-prefix``).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

QUEUE_GROUP = "infera"
KV_STREAM = "INFERA_KV"
DEFAULT_BUCKET = "infera-workers"
DEFAULT_PREFIX = "infera"
RESPONSE_TTL = "1h"
"""How long a responder may keep answering one request (``allow_responses.expires``)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_KEY_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def subject_token(name: str) -> str:
    """``name`` as one subject token (``%XX`` for every character outside ``[A-Za-z0-9_-]``)."""
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), name) or "%"


def request_subject(prefix: str, worker_id: str) -> str:
    return f"{prefix}.req.{subject_token(worker_id)}"


def cancel_subject(request: str) -> str:
    return f"{request}.cancel"


def kv_subject(prefix: str, model: str, worker_id: str) -> str:
    return f"{prefix}.kv.{subject_token(model)}.{subject_token(worker_id)}"


def bucket_key(worker_id: str) -> str:
    """The record bucket's key of ``worker_id`` (``=XX`` for every other character; reversible)."""
    return "".join(c if c in _KEY_SAFE else "".join(f"={b:02X}" for b in c.encode()) for c in worker_id)


def inbox_prefix(user: str) -> str:
    """The inbox prefix of ``user``'s clients: its replies and JetStream deliveries land there,
    and only that user may subscribe to it."""
    return f"_INBOX.{subject_token(user)}"


def worker_user(worker_id: str) -> str:
    return f"worker-{worker_id}"


@dataclass(frozen=True)
class Plane:
    """Where the plane's things are named (the NATS plugin's ``--nats-subject-prefix`` and
    ``--nats-bucket``)."""

    prefix: str = DEFAULT_PREFIX
    bucket: str = DEFAULT_BUCKET


def _stream_api(stream: str, *, read: bool) -> list[str]:
    api = "$JS.API"
    subjects = [f"{api}.STREAM.INFO.{stream}", f"{api}.STREAM.CREATE.{stream}"]
    if read:  # JetStream consumers (ordered push consumers: KV watch, KV event follow)
        subjects += [
            f"{api}.CONSUMER.CREATE.{stream}",
            f"{api}.CONSUMER.CREATE.{stream}.>",
            f"{api}.CONSUMER.DELETE.{stream}.>",
            f"{api}.CONSUMER.INFO.{stream}.>",
        ]
    return subjects


def _cards_api(plane: Plane, *, write: bool) -> list[str]:
    """The model-card object store (``<bucket>_CARDS``): routers read cards, launchers also
    write and release them. Cards are content-addressed and the router checks each digest,
    so a worker cannot make another worker's model tokenize differently, only drop a card
    (the router then routes that model by text prefix)."""
    store = f"{plane.bucket}_CARDS"
    stream = f"OBJ_{store}"
    subjects = [
        *_stream_api(stream, read=True),
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        "$JS.API.STREAM.NAMES",  # reading an object finds its stream by subject
        "$JS.FC.>",
    ]
    if write:
        subjects += [f"$O.{store}.C.>", f"$O.{store}.M.>", f"$JS.API.STREAM.PURGE.{stream}"]
    return subjects


def _state_api(plane: Plane) -> list[str]:
    """The shared-state key-value bucket (``<bucket>_STATE``: API-key budgets across router
    replicas), read and written by routers only."""
    stream = f"KV_{plane.bucket}_STATE"
    return [
        *_stream_api(stream, read=False),
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$KV.{plane.bucket}_STATE.>",
    ]


def router_permissions(plane: Plane, user: str = "router") -> dict[str, Any]:
    records = f"KV_{plane.bucket}"
    publish = [
        *_cards_api(plane, write=False),
        *_state_api(plane),
        f"{plane.prefix}.req.>",  # requests and cancels to any worker
        *_stream_api(KV_STREAM, read=True),
        *_stream_api(records, read=True),
        f"$JS.API.STREAM.MSG.GET.{records}",
        f"$JS.API.DIRECT.GET.{records}",
        f"$JS.API.DIRECT.GET.{records}.>",
        "$JS.API.INFO",
        "$JS.FC.>",  # flow-control answers of its consumers
    ]
    return {"publish": {"allow": publish}, "subscribe": {"allow": [f"{inbox_prefix(user)}.>"]}}


def worker_permissions(plane: Plane, worker_id: str, user: str | None = None) -> dict[str, Any]:
    user = user or worker_user(worker_id)
    token = subject_token(worker_id)
    records = f"KV_{plane.bucket}"
    key = bucket_key(worker_id)
    request = request_subject(plane.prefix, worker_id)
    publish = [
        f"{plane.prefix}.kv.*.{token}",  # its KV events (any served model name), per DP rank
        f"{plane.prefix}.kv.*.{token}.>",
        f"$KV.{plane.bucket}.{key}",  # its own record
        *_stream_api(KV_STREAM, read=False),
        *_stream_api(records, read=False),
        f"$JS.API.STREAM.MSG.GET.{records}",
        f"$JS.API.DIRECT.GET.{records}.$KV.{plane.bucket}.{key}",
        "$JS.API.INFO",
        "$JS.FC.>",
        *_cards_api(plane, write=True),
    ]
    subscribe = [f"{request} {QUEUE_GROUP}", cancel_subject(request), f"{inbox_prefix(user)}.>"]
    return {
        "publish": {"allow": publish},
        "subscribe": {"allow": subscribe},
        "allow_responses": {"max": -1, "expires": RESPONSE_TTL},
    }


ADMIN_PERMISSIONS: dict[str, Any] = {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}


@dataclass
class Credentials:
    """One user's name and password (and the inbox prefix its clients must use)."""

    user: str
    password: str

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.user)

    def settings(self) -> dict[str, str]:
        """The NATS plugin's settings fields for this user."""
        return {
            "nats_user": self.user,
            "nats_password": self.password,
            "nats_inbox_prefix": self.inbox_prefix,
        }

    def env(self) -> dict[str, str]:
        """The same as ``INFERA_*`` environment variables."""
        return {f"INFERA_{k.upper()}": v for k, v in self.settings().items()}


@dataclass
class Layout:
    """Users and their permissions for one plane: ``admin``, ``router`` and one user per worker."""

    plane: Plane = field(default_factory=Plane)
    users: dict[str, tuple[Credentials, dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def generate(cls, worker_ids: list[str], plane: Plane | None = None) -> Layout:
        layout = cls(plane or Plane())
        layout.add("admin", ADMIN_PERMISSIONS)
        layout.add("router", router_permissions(layout.plane))
        for wid in worker_ids:
            layout.add_worker(wid)
        return layout

    def add(self, user: str, permissions: dict[str, Any]) -> Credentials:
        creds = Credentials(user, secrets.token_urlsafe(24))
        self.users[user] = (creds, permissions)
        return creds

    def add_worker(self, worker_id: str) -> Credentials:
        user = worker_user(worker_id)
        return self.add(user, worker_permissions(self.plane, worker_id, user))

    def credentials(self, user: str) -> Credentials:
        return self.users[user][0]

    def worker(self, worker_id: str) -> Credentials:
        return self.credentials(worker_user(worker_id))

    def authorization(self) -> dict[str, Any]:
        """The ``authorization`` block of a nats-server configuration."""
        return {
            "users": [
                {"user": c.user, "password": c.password, "permissions": perms}
                for c, perms in self.users.values()
            ]
        }


def server_config(
    layout: Layout | None,
    *,
    host: str = "127.0.0.1",
    port: int = 4222,
    store_dir: str | None = None,
    max_payload: int | None = None,
) -> str:
    """A nats-server configuration (JSON) with JetStream and, given a layout, its users."""
    config: dict[str, Any] = {"host": host, "port": port, "jetstream": {}}
    if store_dir:
        config["jetstream"]["store_dir"] = store_dir
    if max_payload is not None:
        config["max_payload"] = max_payload
    if layout is not None:
        config["authorization"] = layout.authorization()
    return json.dumps(config, indent=2)
