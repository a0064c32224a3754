"""What the adapter step remembers across passes (issue 33): when each adapter was last
asked for, why a load last failed, which loads it refused lately and which it
announced. Soft, the term's: a takeover starts from nothing (adapters then look
idle until asked for, and are loaded again by demand). The adapters' view reads it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

FAILED_BACKOFF_S = 60.0  # a load refused on a replica is not tried there again before
RATE_KEEP = 0.9  # per pass: a request rate smoothed over about ten passes


@dataclass
class AdapterMemory:
    """Per adapter: when it was last asked for, its gateways' request count then,
    and why a load last failed; per (replica, adapter): a load refused (when), and
    the loads already announced."""

    last_used: dict[str, float] = field(default_factory=dict)  # monotonic
    requests: dict[str, int] = field(default_factory=dict)
    last_failure: dict[str, str] = field(default_factory=dict)
    failed: dict[tuple[str, str], float] = field(default_factory=dict)
    announced: set[tuple[str, str]] = field(default_factory=set)
    # (replica, adapter) this term told an engine to unload: what an engine still
    # reports holding is adopted (a restart or takeover kept it loaded), but not these.
    dropped: set[tuple[str, str]] = field(default_factory=set)
    rate: dict[str, float] = field(default_factory=dict)  # smoothed requests per pass

    def observe(
        self,
        now: float,
        declared: Mapping[str, object],
        busy: Mapping[str, int],
        requests: Mapping[str, int],
    ) -> None:
        for name in declared:
            seen = requests.get(name, 0)
            new = max(0, seen - self.requests.get(name, seen))
            if busy.get(name) or new:
                self.last_used[name] = now
            self.requests[name] = seen
            # How busy it is lately (requests per pass, smoothed): who makes room first.
            self.rate[name] = RATE_KEEP * self.rate.get(name, 0.0) + (1 - RATE_KEEP) * (
                new + busy.get(name, 0)
            )
        for gone in [n for n in self.last_used if n not in declared]:
            del self.last_used[gone]
        for gone in [n for n in self.requests if n not in declared]:
            del self.requests[gone]
            self.rate.pop(gone, None)
        self.failed = {k: t for k, t in self.failed.items() if now - t < FAILED_BACKOFF_S}

    def idle_for(self, name: str, now: float) -> float | None:
        used = self.last_used.get(name)
        return None if used is None else now - used
