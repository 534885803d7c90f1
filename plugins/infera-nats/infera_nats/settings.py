"""The NATS plugin's settings: one model shared by its discovery backend and transports.

Every field becomes a flag (``--nats-url``…) and an ``INFERA_*`` variable of
``infera-run serve``, ``worker``, ``up`` and ``workers`` (core adds the fields of every
installed backend's ``settings_model``). Backends read it with
``options.get(NatsSettings)``.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from infera_core.config.settings import InferaSettings

BUCKET_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"


class NatsSettings(InferaSettings):
    """Where NATS is and how Infera names things in it."""

    nats_url: str = Field(
        "nats://127.0.0.1:4222",
        description="NATS server URL(s), a comma list (nats://[user:pass@]host:port).",
    )
    nats_bucket: str = Field(
        "infera-workers",
        description="JetStream key-value bucket of worker records (--discovery-backend nats).",
    )

    nats_subject_prefix: str = Field(
        "infera", description="First token of the subjects Infera uses (requests, KV events)."
    )

    # -- credentials (nats-server's authorization; see docs/how-to/operate.md) ----------------
    nats_user: str | None = Field(None, description="NATS user name (with --nats-password).")
    nats_password: SecretStr | None = Field(
        None, description="NATS password of --nats-user. Prefer the env var to the flag."
    )
    nats_password_file: str | None = Field(
        None,
        description="File holding the NATS password of --nats-user (a mounted secret; instead of "
        "--nats-password).",
    )
    nats_token: SecretStr | None = Field(None, description="NATS authentication token.")
    nats_creds: str | None = Field(
        None, description="NATS credentials file (.creds: user JWT + nkey seed; needs the nkeys package)."
    )
    nats_nkey_seed: str | None = Field(
        None, description="File holding an NKey seed for NATS nkey authentication (needs the nkeys package)."
    )
    nats_tls_cert: str | None = Field(None, description="TLS client certificate (PEM) for NATS.")
    nats_tls_key: str | None = Field(None, description="Private key (PEM) of --nats-tls-cert.")
    nats_tls_ca: str | None = Field(
        None, description="CA bundle (PEM) that signed the NATS server's certificate."
    )
    nats_inbox_prefix: str | None = Field(
        None,
        description="Prefix of this process's reply inboxes (default: _INBOX.<user> with --nats-user, "
        "else _INBOX); the permission layout lets each user subscribe only to its own.",
    )

    @field_validator("nats_url")
    @classmethod
    def _urls(cls, value: str) -> str:
        urls = [u.strip() for u in value.split(",") if u.strip()]
        if not urls:
            raise ValueError("expected at least one NATS URL")
        for url in urls:
            if "://" in url and url.split("://", 1)[0] not in ("nats", "tls", "ws", "wss"):
                raise ValueError(f"{url!r}: the scheme must be nats://, tls://, ws:// or wss://")
        return ",".join(urls)

    @field_validator("nats_bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        if not value or any(c not in BUCKET_CHARS for c in value):
            raise ValueError("a bucket name is letters, digits, '-' and '_'")
        return value

    def authenticated(self) -> bool:
        """Credentials are configured (the server then enforces a permission layout)."""
        return bool(
            self.nats_user or self.nats_token or self.nats_creds or self.nats_nkey_seed or self.nats_tls_cert
        )

    def servers(self) -> list[str]:
        """The URLs, each with a scheme (``host:port`` means ``nats://host:port``)."""
        return [u if "://" in u else f"nats://{u}" for u in self.nats_url.split(",")]
