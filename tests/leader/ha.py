"""Several real controller processes on one PostgreSQL, with agents and ctl that
are given every controller's URL (`--controller A,B`)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.procs import TAG_VAR, Cluster, ControllerProcess, _tail, wait_until

LEASE_TTL_S = 3.0  # short, so a test's failover takes seconds (the default is 8)


class HaCluster(Cluster):
    def __init__(self, root: Path, pg_url: str, controllers: int = 2) -> None:
        super().__init__(root)
        self.pg_url = pg_url
        self.controllers = [
            ControllerProcess(
                self.root / f"controller-{i}.log",
                store=pg_url,
                args=("--lease-ttl", str(LEASE_TTL_S)),
                env={TAG_VAR: self.tag},
                cwd=self.root,
            )
            for i in range(controllers)
        ]
        self.procs: dict[int, ControllerProcess] = {}  # those started
        self.ports = [c.port for c in self.controllers]
        self.urls = [c.url for c in self.controllers]
        self.url = ",".join(self.urls)  # what agents and ctl are given
        self.clients = [httpx.Client(base_url=u, timeout=5.0) for u in self.urls]
        self.extra: tuple[str, ...] = ()

    def start(self, i: int, *extra: str, role: str | None = None) -> None:
        """Start controller `i`; wait until it answers /healthz (in `role`, if given)."""
        if extra:
            self.extra = extra

        def up() -> bool | None:
            health = self.health(i)
            return health is not None and (role is None or health["role"] == role)

        self.procs[i] = self.controllers[i]
        self.procs[i].start(
            *self.extra,
            ready=up,
            what=f"controller {i} to answer /healthz as {role}",
            diagnose=self.logs,
        )

    def health(self, i: int) -> dict[str, Any] | None:
        try:
            resp = self.clients[i].get("/healthz", timeout=1)
        except httpx.HTTPError:
            return None
        return dict(resp.json()) if resp.status_code == 200 else None

    def leaders(self) -> list[int]:
        """Controllers that say they lead (never more than one, the tests check)."""
        out = []
        for i in self.procs:
            h = self.health(i)
            if h is not None and h["role"] == "leader":
                out.append(i)
        return out

    def wait_leader(self, timeout: float = 15) -> int:
        def one() -> int | None:
            leaders = self.leaders()
            assert len(leaders) <= 1, f"two leaders at once: {leaders}\n{self.logs()}"
            return leaders[0] if leaders else None

        return wait_until(one, timeout=timeout, what="one leader", diagnose=self.logs)

    def signal(self, i: int, sig: int) -> None:
        self.procs[i].send_signal(sig)

    def kill(self, i: int) -> None:
        self.procs[i].stop(signal.SIGKILL, timeout=10)

    def leader_get(self, path: str) -> Any:
        """GET from whichever controller leads now (None while none does)."""
        for client in self.clients:
            with contextlib.suppress(httpx.HTTPError):
                resp = client.get(path, timeout=2)
                if resp.status_code == 200:
                    return resp.json()
        return None

    def get(self, path: str) -> Any:
        answer = self.leader_get(path)
        if answer is None:
            raise httpx.HTTPError(f"no controller leads to answer {path}")
        return answer

    def logs(self) -> str:
        parts = [
            f"--- controller {i} ---\n{_tail(self.root / f'controller-{i}.log')}"
            for i in sorted(self.procs)
        ]
        for name in sorted(self.agent_args):
            parts.append(f"--- agent {name} ---\n{_tail(self.root / f'agent-{name}.log')}")
        return "\n".join(parts)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.close()  # a paused one too
        for client in self.clients:
            client.close()
        super().close()
