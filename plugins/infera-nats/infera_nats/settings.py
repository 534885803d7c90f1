"""The NATS plugin's settings: one model shared by its discovery backend and transports.

Every field becomes a flag (``--nats-url``…) and an ``INFERA_*`` variable of
``infera-run serve``, ``worker``, ``up`` and ``workers`` (core adds the fields of every
installed backend's ``settings_model``). Backends read it with
``options.get(NatsSettings)``.
"""

from __future__ import annotations

from pydantic import Field, field_validator

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

    def servers(self) -> list[str]:
        """The URLs, each with a scheme (``host:port`` means ``nats://host:port``)."""
        return [u if "://" in u else f"nats://{u}" for u in self.nats_url.split(",")]
