"""Access-control settings, shared by ``infera-run serve`` and ``infera-run up``."""

from __future__ import annotations

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
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token for /v1/workers, /v1/admin/*, /metrics and direct mode "
        "(unset: those answer loopback clients only). Prefer the env var to the flag.",
    )
    public_metrics: bool = Field(False, description="Serve /metrics to anyone, without the admin token.")

    def auth_of(self) -> dict[str, Any]:
        """These fields as keyword arguments (``up`` hands them to its server's settings)."""
        return {name: getattr(self, name) for name in AuthSettings.model_fields}
