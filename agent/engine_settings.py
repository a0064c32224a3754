"""How the engine supervisor runs this node's engines: one frozen object, built once
(the agent's CLI from its flags, tests with defaults), read by every part of the
supervisor (agent/engines.py) and changed by none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from llmgw.agent.engine_templates import EngineTemplate, merged_templates

STATE_FILE = "engines.json"
LOCK_FILE = "engines.lock"
# How often a starting engine's log and CPU are looked at (a pass over /proc).
START_LOOK_S = 10.0


@dataclass(frozen=True)
class SupervisorSettings:
    """state_dir: the engines' state file, lock and logs. templates: the built-ins
    with the operator's added or replacing them by name (`merged_templates`).
    address: where other nodes reach this one (a rank-0 leader's own rendezvous
    address). engine_host: the address engines listen on (the agent passes
    --engine-host, else --address; never every interface unless asked).
    grace_s: SIGTERM to SIGKILL. start_timeout_s: how long a starting engine may
    take to answer /health (loading a large model from a slow filer takes many
    minutes). start_stall_s: how long a starting engine may write nothing and use
    under a second of CPU (0: no limit). unhealthy_after: failed /health checks in
    a row, one per scrape interval, before a ready engine is declared hung.
    worker_settle_s: a rank that serves no HTTP (a multi-node worker) is ready
    once it has stayed up this long; the leader's health covers the replica.
    sleep_settle_s: how long a sleep's memory may take to leave the cards.
    The other interval and timeout knobs exist for tests; the defaults suit
    production."""

    state_dir: Path
    node: str
    address: str | None = None
    templates: Mapping[str, EngineTemplate] = field(default_factory=merged_templates)
    engine_host: str = "127.0.0.1"
    extra_env: Mapping[str, str] = field(default_factory=dict)  # added to every engine's
    grace_s: float = 30.0
    poll_interval_s: float = 1.0
    scrape_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    worker_settle_s: float = 2.0
    start_timeout_s: float = 1800.0
    start_stall_s: float = 600.0
    unhealthy_after: int = 3
    sleep_settle_s: float = 2.0
    start_look_s: float = START_LOOK_S

    def __post_init__(self) -> None:
        # Frozen: normalised once here, read-only copies so nobody changes them later.
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        object.__setattr__(self, "templates", MappingProxyType(dict(self.templates)))
        object.__setattr__(self, "extra_env", MappingProxyType(dict(self.extra_env)))
        object.__setattr__(self, "unhealthy_after", max(1, self.unhealthy_after))

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def lock_path(self) -> Path:
        return self.state_dir / LOCK_FILE

    @property
    def probe_host(self) -> str:
        """Where the agent reaches its engines: loopback when they listen everywhere."""
        return "127.0.0.1" if self.engine_host in ("", "0.0.0.0", "::") else self.engine_host
