"""How the supervisor's parts talk to their engines: one HTTP session, the address
each engine answers on, and a POST that says what happened instead of raising."""

from __future__ import annotations

from typing import NamedTuple

import aiohttp

from llmgw.agent.engine_settings import SupervisorSettings
from llmgw.agent.engine_shard import Engine
from llmgw.wire import printable

SLEEP_TIMEOUT_S = 300.0  # a sleep or a wake (a level-2 wake reloads the weights from disk)


class Refused(NamedTuple):
    """A sleep, wake or reload the engine did not do: its HTTP status (None: no
    answer) beside the words the report quotes."""

    status: int | None
    message: str


class EngineHttp:
    """Owns the one client session the probes, sleeps, wakes and adapter loads share
    (opened at first use, closed by `close`)."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self._host = settings.probe_host
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    @staticmethod
    def headers(eng: Engine) -> dict[str, str]:
        """What every request to `eng` carries: its replica's key, which the engine asks
        for on its API (vLLM's /v1 paths); sent to every path, harmless where unasked."""
        key = eng.assignment.engine_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def url(self, eng: Engine, path: str) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{eng.port}{path}"

    async def post(
        self, eng: Engine, path: str, body: dict[str, str] | None = None
    ) -> Refused | None:
        """POST to the engine; None when it answered 200, else what happened."""
        try:
            timeout = aiohttp.ClientTimeout(total=SLEEP_TIMEOUT_S)
            async with self.session.post(
                self.url(eng, path), json=body, timeout=timeout, headers=self.headers(eng)
            ) as r:
                if r.status == 200:
                    return None
                text = printable((await r.text())[:200]) or "nothing"
                return Refused(r.status, f"POST {path} answered {r.status}: {text}")
        except TimeoutError:
            return Refused(None, f"POST {path}: no answer within {SLEEP_TIMEOUT_S:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return Refused(None, f"POST {path}: {str(exc) or type(exc).__name__}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
