"""Client API keys for the gateway: a file of `KEY` or `TENANT KEY` lines, or one env key."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ENV_KEY = "LLMGW_GATEWAY_API_KEY"
_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class ApiKey:
    tenant: str
    key: str


def load_keys(path: Path | None, env: dict[str, str] | None = None) -> list[ApiKey]:
    """Keys from `path` (one per line, `#` comments), else from LLMGW_GATEWAY_API_KEY.

    Raises ValueError with a message a person can act on."""
    env = dict(os.environ) if env is None else env
    keys: list[ApiKey] = []
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read --api-key-file: {exc}") from exc
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) > 2 or (len(parts) == 2 and not _TENANT.match(parts[0])):
                raise ValueError(
                    f"{path}:{n}: want `KEY` or `TENANT KEY` (tenant: letters, digits, ._-)"
                )
            tenant, key = (parts[0], parts[1]) if len(parts) == 2 else (f"key{n}", parts[0])
            keys.append(ApiKey(tenant, key))
        if not keys:
            raise ValueError(f"--api-key-file {path} holds no key")
    elif env.get(ENV_KEY, "").strip():
        keys.append(ApiKey("default", env[ENV_KEY].strip()))
    for k in keys:
        if ":" in k.key or len(k.key) < 8:
            raise ValueError(f"API key of {k.tenant} must be at least 8 characters, without ':'")
    return keys
