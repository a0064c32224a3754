"""Which client keys this gateway takes, and what each allows: a key's SHA-256 ->
its grant (tenant, model patterns, expiry).

Two sources: the controller's keys (`ctl keys`), followed on its key feed, of
which this gateway only ever receives digests; and the key file
(`--api-key-file`, `KEY` or `TENANT KEY` lines: every model), for a single
gateway without a controller's keys. Both are taken at once when both exist.

A gateway that loses the controller keeps the last keys it had for as long as it
runs (each still refused past its own expiry); a new key or a revocation reaches
it when it hears from a controller again. Until the feed first answers, the
controller's keys are unknown: with a key file the gateway serves its keys alone
meanwhile; without, the front refuses every request but /health with a 503 rather
than guess (an older controller without a key feed counts as one with no keys).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.gateway.keys import ApiKey
from llmgw.tenant_keys import ALL_MODELS, Models, digest
from llmgw.wire import ClientKeyEntry

USED_PER_STATUS = 500  # about 20 KB of a status; its bound is 64 KiB and more


@dataclass(frozen=True, slots=True)
class Grant:
    tenant: str
    models: Models
    key_id: str | None  # the controller's id; None for a key from the file
    expires_at: float | None = None

    @property
    def from_file(self) -> bool:
        return self.key_id is None


class Keyring:
    def __init__(self, file_keys: Iterable[ApiKey] = ()) -> None:
        every = Models(ALL_MODELS)
        self._file = {digest(k.key): Grant(k.tenant, every, None) for k in file_keys}
        self._controller: dict[str, Grant] = {}
        self._by_digest = dict(self._file)
        self.known = False  # the controller's keys read at least once
        self.used: dict[str, float] = {}  # key id -> last seen, since the last status

    @property
    def required(self) -> bool:
        """Whether a request needs a key (any is configured, or none is known yet)."""
        return bool(self._by_digest) or not self.known

    def set_controller_keys(self, entries: Iterable[ClientKeyEntry]) -> None:
        self._controller = {
            e.digest: Grant(e.tenant, Models(e.models), e.id, e.expires_at) for e in entries
        }
        # A file key wins over a controller key of the same digest: it has no expiry.
        self._by_digest = self._controller | self._file
        self.known = True

    def grant(self, bearer: str) -> Grant | None:
        """The grant of the key `bearer` presents, or None (unknown or expired)."""
        found = self._by_digest.get(digest(bearer))
        if found is None:
            return None
        if found.expires_at is not None:
            now = time.time()
            if now >= found.expires_at:
                return None
        if found.key_id is not None:
            self.used[found.key_id] = time.time()
        return found

    def take_used(self, most: int = USED_PER_STATUS) -> dict[str, float]:
        """Keys used since the last call, at most `most` (the rest wait for the next):
        a status stays far below the controller's bound on its size."""
        if len(self.used) <= most:
            used, self.used = self.used, {}
            return used
        ids = list(self.used)[:most]
        return {i: self.used.pop(i) for i in ids}

    @property
    def has_file_keys(self) -> bool:
        return bool(self._file)

    @property
    def counts(self) -> tuple[int, int]:
        """(keys from the controller, keys from the file)."""
        return len(self._controller), len(self._file)
