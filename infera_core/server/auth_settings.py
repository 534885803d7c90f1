"""Access-control settings, shared by ``infera-run serve`` and ``infera-run up``."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr

DEFAULT_MAX_TOKENS = 4096
"""``--budget-max-tokens``'s default."""


class AuthSettings(BaseModel):
    """Client API keys, the admin token and who may read ``/metrics``."""

    api_key_file: Path | None = Field(
        None,
        description="YAML/JSON file of client API keys (name, key or key_sha256, models, "
        "requests_per_minute, tokens_per_day); with it, /v1/* needs a key. Re-read when it changes.",
    )
    budget_max_tokens: int = Field(
        DEFAULT_MAX_TOKENS,
        gt=0,
        description="Output tokens reserved per sequence against a key's tokens_per_day when a request "
        "sets no max_tokens/max_completion_tokens (admission reserves prompt + max_tokens × n).",
    )
    global_budgets: bool = Field(
        True,
        description="With etcd or NATS discovery, keep the keys' requests_per_minute and tokens_per_day "
        "in that store, one budget for all router replicas (leased slices; see docs/how-to/operate.md). "
        "--no-global-budgets: each router its own.",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token for /v1/workers, /v1/admin/*, /metrics and direct mode "
        "(unset: those answer loopback clients only). Prefer the env var to the flag.",
    )
    public_metrics: bool = Field(False, description="Serve /metrics to anyone, without the admin token.")

    def auth_of(self) -> dict[str, Any]:
        """These fields as keyword arguments (``up`` hands them to its server's settings)."""
        return {name: getattr(self, name) for name in AuthSettings.model_fields}

    def open_to_network(self, host: str) -> str | None:
        """The warning to log when serving on ``host`` leaves inference open to the network
        (a non-loopback address and no ``--api-key-file``); None when it does not."""
        if self.api_key_file is not None or is_loopback(host):
            return None
        admin = (
            "the admin routes need --admin-token"
            if self.admin_token is not None
            else "the admin routes answer loopback clients only"
        )
        return (
            f"listening on {host} without --api-key-file: anyone who can reach this port can run"
            f" inference on the fleet ({admin}); set --api-key-file (INFERA_API_KEY_FILE), or"
            " --host 127.0.0.1 to serve this machine only"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine only."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface
