"""Controller settings: one frozen object built by the CLI, the demo or a test."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.controller.core.auth import Tokens
from llmgw.wire import IDLE_AFTER_S

DEFAULT_LISTEN = "127.0.0.1:7460"
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ControllerSettings:
    state_dir: Path
    listen: str = DEFAULT_LISTEN
    tokens: Tokens = field(default_factory=Tokens)
    # A node is unreachable after grace_intervals report intervals plus grace_extra_s
    # without a report: one late report must never flip a node.
    grace_intervals: float = 3.0
    grace_extra_s: float = 5.0
    # Replicas on a node unreachable this long are replaced elsewhere.
    replace_after_s: float = 300.0
    # A ready replica nothing asked anything for this long is idle (`--idle-after`): the
    # summary lists it, and demand takes idle replicas first. Minutes in production.
    idle_after_s: float = IDLE_AFTER_S
    # A LoRA adapter nothing asked for this long is unloaded (issue 33).
    adapter_idle_s: float = 300.0
    # A fatal card fault cordons its node (by llmgw); replicas on the card move either way.
    cordon_on_gpu_fault: bool = True
    # A model whose replicas keep failing waits base * 2^(failures-1), up to cap.
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0
    # ...and it ends once one of its replicas has been ready this long: an engine that
    # dies just after it turned ready (at its first request, say) still backs off.
    backoff_reset_s: float = 60.0
    reconcile_interval_s: float = 1.0
    # A pass also runs as soon as something the loop waits on happened (an engine
    # ready, asleep or failed; held requests; a gateway letting go): `Term.decide_soon`.
    # Off only where a test drives every pass itself.
    reconcile_on_news: bool = True
    # A replica marked stopping is stopped once every live gateway has let go of
    # it, or after this long, whichever is first (endpoints.py).
    stop_grace_s: float = 60.0
    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = 30.0  # to receive a request body; slower is a 408
    # `/metrics`: also served without a token on this loopback HOST:PORT; per-node series opt-in.
    metrics_listen: str | None = None
    metrics_per_node: bool = False
    # `--store`: None is SQLite in state_dir; else "sqlite:DIR" or "postgresql://...".
    store: str | None = None
    # The URL others should use for this controller (`--advertise-url`; else from listen).
    advertise_url: str | None = None
    # PostgreSQL: the leader's lease lasts this long unless renewed (every TTL/4); a
    # follower takes over within about this long after the leader dies.
    lease_ttl_s: float = 8.0
    # Bounded enrollment: new nodes await `ctl credentials approve` before they get
    # work; enrollments taken per second across all callers (bursts of 2 s worth).
    enroll_approval: bool = False
    enroll_rate: float = 5.0

    @property
    def url(self) -> str:
        if self.advertise_url:
            return self.advertise_url
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]


def split_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) -> (host, port); a usage error says so."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen wants HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
