"""How a NATS client of the plugin authenticates: the credentials in :class:`NatsSettings`.

Whatever nats-py supports: user + password (``--nats-user``/``--nats-password``, or in the
URL), a token, a ``.creds`` file (user JWT + nkey seed) or an nkey seed file (both need
the ``nkeys`` package), and TLS (a client certificate for servers that verify clients, a
CA bundle for the server's). ``inbox_prefix`` is where the process's replies and
JetStream deliveries land; the permission layout (:mod:`infera_core.util.nats_layout`)
lets each user subscribe to its own inbox only, so with ``--nats-user`` it defaults to
``_INBOX.<user>``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from infera_core.util.nats_layout import inbox_prefix
from infera_nats.settings import NatsSettings


class NatsAuthError(ConnectionError):
    """The configured credentials cannot be used (a file is missing, a key does not load)."""


@dataclass(frozen=True)
class NatsAuth:
    user: str | None = None
    password: str | None = None
    password_file: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey_seed: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    inbox: str | None = None

    @classmethod
    def of(cls, s: NatsSettings) -> NatsAuth:
        return cls(
            user=s.nats_user,
            password=s.nats_password.get_secret_value() if s.nats_password else None,
            password_file=s.nats_password_file,
            token=s.nats_token.get_secret_value() if s.nats_token else None,
            creds=s.nats_creds,
            nkey_seed=s.nats_nkey_seed,
            tls_cert=s.nats_tls_cert,
            tls_key=s.nats_tls_key,
            tls_ca=s.nats_tls_ca,
            inbox=s.nats_inbox_prefix,
        )

    @property
    def inbox_prefix(self) -> str:
        if self.inbox:
            return self.inbox
        return inbox_prefix(self.user) if self.user else "_INBOX"

    def describe(self) -> str:
        """Which credentials are used, for error lines (never the secrets)."""
        parts = []
        if self.user:
            parts.append(f"user {self.user!r}")
        if self.token:
            parts.append("a token")
        if self.creds:
            parts.append(f"creds {self.creds}")
        if self.nkey_seed:
            parts.append(f"nkey seed {self.nkey_seed}")
        if self.tls_cert:
            parts.append(f"TLS certificate {self.tls_cert}")
        return ", ".join(parts) or "no credentials"

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments of ``nats.aio.client.Client.connect``."""
        opts: dict[str, Any] = {"inbox_prefix": self.inbox_prefix}
        if self.user:
            opts["user"] = self.user
            opts["password"] = self.password or self._read_password()
        if self.token:
            opts["token"] = self.token
        if self.creds:
            opts["user_credentials"] = self.creds
        if self.nkey_seed:
            opts["nkeys_seed"] = self.nkey_seed
        if self.tls_cert or self.tls_ca:
            opts["tls"] = self._tls()
        return opts

    def _read_password(self) -> str:
        if not self.password_file:
            return ""
        try:
            with open(self.password_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise NatsAuthError(
                f"cannot read --nats-password-file {self.password_file}: {exc.strerror}"
            ) from None

    def _tls(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise NatsAuthError(
                f"cannot load the NATS TLS files (--nats-tls-cert/--nats-tls-key/--nats-tls-ca): {exc}"
            ) from None
        return ctx
