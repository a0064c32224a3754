"""Enrollment: trade the enrollment token for this node's own credential, once.

The credential is kept in STATE_DIR/credential (mode 0600, written atomically)
and used from then on; the enrollment token is not needed again. A controller
with --enroll-approval gives no work to the node until an admin approves it; it
reports meanwhile. Too many enrollments at once are a 429: tried again later. The controller
enrolls a node name only once: an agent that lost its credential file stays
refused until an operator revokes the old one (`llmgw ctl credentials revoke`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import aiohttp

from llmgw import api
from llmgw.agent.loop import ReportError, connection_error
from llmgw.leader import Endpoints, aiohttp_request, split_urls

CREDENTIAL_FILE = "credential"
ENROLL_PATH = api.enroll().path

log = logging.getLogger(__name__)


def read_credential(state_dir: Path) -> str | None:
    try:
        text = (state_dir / CREDENTIAL_FILE).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text or None


def save_credential(state_dir: Path, secret: str) -> Path:
    """Write the credential readable by this user only, never half-written."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / CREDENTIAL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


class Enroller:
    def __init__(
        self, controller: str, node: str, enroll_token: str, state_dir: Path, timeout_s: float = 10
    ) -> None:
        self.endpoints = Endpoints(split_urls(controller))  # enrollment goes to the leader
        self.node = node
        self.enroll_token = enroll_token
        self.state_dir = state_dir
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def credential(self, session: aiohttp.ClientSession) -> str:
        """The stored credential, or a new one from the controller (then stored)."""
        stored = read_credential(self.state_dir)
        if stored is not None:
            return stored
        headers = {"Authorization": f"Bearer {self.enroll_token}"}
        try:
            _, status, raw = await aiohttp_request(
                session,
                self.endpoints,
                "POST",
                ENROLL_PATH,
                json={"node": self.node},
                headers=headers,
                timeout=self.timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise connection_error(self.endpoints.current, exc) from exc
        text = raw.decode("utf-8", "replace")
        if status in (401, 403):
            raise ReportError(
                "auth",
                f"enrollment refused (HTTP {status}): {text[:300]}; "
                "check --enroll-token-file or LLMGW_ENROLL_TOKEN",
            )
        if status == 409:
            raise ReportError("enroll", f"enrollment refused: {text[:400]}")
        if status == 429:  # the controller bounds enrollments per second: the loop backs off
            raise ReportError("enroll", f"enrollment: HTTP 429, trying again later: {text[:300]}")
        if status != 200:
            raise ReportError("http", f"enrollment: HTTP {status}: {text[:300]}")
        try:
            reply = json.loads(text)
            secret = str(reply["credential"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ReportError("reply", f"unreadable enrollment reply: {exc}") from exc
        path = save_credential(self.state_dir, secret)
        log.info("enrolled as node %s; credential kept in %s", self.node, path)
        if reply.get("awaiting_approval"):
            log.warning(
                "node %s gets no replicas until an admin approves it: "
                "llmgw ctl credentials approve %s",
                self.node,
                self.node,
            )
        return secret
