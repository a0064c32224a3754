"""`python -m llmgw.gateway.smg_child ARGS`: `smg launch ARGS`, with its secrets from a file.

SMG takes its control-plane key and its client (tenant) keys only as command-line
options, and a command line is readable by every local user (/proc/PID/cmdline).
So the gateway starts SMG through this module: the options without secrets on
the command line, the secrets in a JSON file of mode 0600 in the gateway's 0700
work dir, named by LLMGW_SMG_SECRETS. They are handed to SMG's launcher inside
this process, the same parsing `smg launch` applies to its options.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SECRETS_ENV = "LLMGW_SMG_SECRETS"


def write_secrets(path: Path, control_plane: list[str], tenants: list[str]) -> None:
    """Write the secrets file, created with mode 0600 (never readable by others)."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"control_plane_api_keys": control_plane, "tenant_api_keys": tenants}, f)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    from smg.launch_router import launch_router, parse_router_args
    from smg.router_args import RouterArgs

    path = os.environ.pop(SECRETS_ENV, "")
    secrets = json.loads(Path(path).read_text()) if path else {}
    args = parse_router_args(argv)
    args.control_plane_api_keys = RouterArgs._parse_control_plane_api_keys(
        secrets.get("control_plane_api_keys", [])
    )
    args.tenant_api_keys = RouterArgs._parse_tenant_api_keys(secrets.get("tenant_api_keys", []))
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
