"""The LoRA adapters one engine holds, brought to what its assignment asks (issue 33).

Through the engine's own endpoints (vLLM's, with VLLM_ALLOW_RUNTIME_LORA_UPDATING):
`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and `POST
/v1/unload_lora_adapter {"lora_name"}`. What the engine holds is read once from its
`/v1/models` (adapters carry a `parent`), so an agent that restarts adopts them; from
then on each answer says. A load the engine refuses is kept with its status and
vLLM's words, reported, and not tried again while the assignment still asks for it
(the controller lets go of it and may ask elsewhere).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from llmgw.wire import printable

log = logging.getLogger(__name__)

TIMEOUT_S = 120.0  # a load reads the adapter from disk
RUNTIME_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@dataclass
class AdapterState:
    loaded: set[str] | None = None  # None: not read from the engine yet
    failures: dict[str, tuple[int | None, str]] = field(default_factory=dict)

    def forget_failures(self, wanted: Mapping[str, str]) -> None:
        """A refusal is kept while the assignment asks for the adapter, no longer."""
        for gone in [n for n in self.failures if n not in wanted]:
            del self.failures[gone]

    def due(self, wanted: Mapping[str, str]) -> bool:
        """Whether a sync has something to do."""
        self.forget_failures(wanted)
        if self.loaded is None:
            return bool(wanted)
        missing = wanted.keys() - self.loaded - self.failures.keys()
        return bool(missing or self.loaded - wanted.keys())


def _said(text: str, status: int) -> str:
    """vLLM's error message from its body, else the text as it came."""
    try:
        body = json.loads(text)
        message = body["error"]["message"] if "error" in body else body["message"]
        return printable(str(message))[:1000]
    except (ValueError, KeyError, TypeError):
        return printable(text[:300]) or f"status {status}"


async def sync(
    http: aiohttp.ClientSession,
    base_url: str,
    state: AdapterState,
    wanted: Mapping[str, str],
    paths: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> None:
    """Unload what is not wanted, then load what is missing (`wanted`: name -> source;
    `paths`: source -> a local directory holding it, from the storage scan)."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    state.forget_failures(wanted)
    if state.loaded is None:
        async with http.get(f"{base_url}/v1/models", timeout=timeout, headers=headers) as r:
            body = await r.json(content_type=None)
        state.loaded = {
            m["id"] for m in body.get("data", []) if isinstance(m, dict) and m.get("parent")
        }
    for name in sorted(state.loaded - wanted.keys()):
        async with http.post(
            f"{base_url}/v1/unload_lora_adapter",
            json={"lora_name": name},
            timeout=timeout,
            headers=headers,
        ) as r:
            text = await r.text()
        if r.status in (200, 404):  # 404: it holds it no longer
            state.loaded.discard(name)
            log.info("unloaded LoRA adapter %s", name)
        else:
            log.warning("unloading LoRA adapter %s: %s", name, _said(text, r.status))
    for name in sorted(wanted.keys() - state.loaded - state.failures.keys()):
        source = wanted[name]
        path = paths.get(source) or source
        try:
            async with http.post(
                f"{base_url}/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": path},
                timeout=timeout,
                headers=headers,
            ) as r:
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            state.failures[name] = (None, f"no answer: {str(exc) or type(exc).__name__}")
            continue
        said = _said(text, r.status)
        if r.status == 200 or (r.status == 400 and "already been loaded" in said):
            state.loaded.add(name)
            log.info("loaded LoRA adapter %s from %s", name, path)
        else:
            state.failures[name] = (r.status, said)
            log.warning("LoRA adapter %s refused (%d): %s", name, r.status, said)
