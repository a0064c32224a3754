"""The fake engine's LoRA adapters, as vLLM keeps them (llmgw.agent.fake_engine).

vLLM (0.x, V1 engine) with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`:
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` answers 200 with a plain-text
  "Success: …" line, or OpenAI's error shape with vLLM's `type` and the status as `code`:
  400 `InvalidUserInput` (a field empty, the name loaded already), 404 `NotFoundError`
  ("No adapter found": no such directory or no `adapter_config.json`), 500
  `InternalServerError` ("Worker failed with error ...": a rank above `--max-lora-rank`,
  no weight file), 400 `BadRequestError` (LoRA not enabled). Checked against vLLM
  0.32's CPU build, paths in messages as `<path>`.
- `POST /v1/unload_lora_adapter {"lora_name"}`: 200, or 404 `NotFoundError` when the name
  is not loaded.
- A loaded adapter stays registered (in `/v1/models`, with its `parent`) until unloaded;
  only `--max-cpu-loras` of them are resident in host memory, least recently used out
  first, and a request for one that was pushed out reads it from disk again. vLLM refuses
  no load for going past that number: keeping within it is the caller's job.
- At most `--max-loras` distinct adapters run in one batch; a request for another waits.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = False  # --enable-lora
    runtime_updates: bool = False  # VLLM_ALLOW_RUNTIME_LORA_UPDATING: the endpoints exist
    max_loras: int = 1  # --max-loras: distinct adapters in one batch
    max_cpu_loras: int | None = None  # --max-cpu-loras: resident in host memory (default max_loras)
    max_lora_rank: int = 16  # --max-lora-rank
    load_s: float = 0.05  # reading one adapter from disk

    @property
    def cpu_slots(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras


class LoraError(Exception):
    """A refusal in vLLM's terms: its HTTP status and error type beside the message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    int_id: int


def _worker_failed(why: str) -> LoraError:
    """How vLLM 0.32 answers a load its engine core's worker refused (checked with the
    CPU build: a 500, not a 400)."""
    return LoraError(
        500,
        "InternalServerError",
        f"Call to add_lora method failed: Worker failed with error '{why}', please check "
        "the stack trace above for the root cause",
    )


def read_adapter(name: str, path: str, max_rank: int) -> int:
    """The adapter's rank, or vLLM's refusal of its files (paths said as `<path>`, as
    vLLM's sanitised messages do)."""
    root = Path(path)
    config_path = root / "adapter_config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise LoraError(
            404, "NotFoundError", f"Loading lora {name} failed: No adapter found for <path>"
        ) from None
    except (OSError, ValueError) as exc:
        raise _worker_failed(f"Loading lora {name} failed: {exc}") from None
    rank = config.get("r") if isinstance(config, dict) else None
    if type(rank) is not int or rank <= 0:
        raise _worker_failed("<path>: 'r' must be a positive integer")
    if rank > max_rank:
        raise _worker_failed(f"LoRA rank {rank} is greater than max_lora_rank {max_rank}.")
    if not any((root / f).is_file() for f in WEIGHT_FILES):
        raise _worker_failed("<path> doesn't contain tensors")
    return rank


@dataclass
class LoraState:
    config: LoraConfig
    base: str  # the parent every adapter names
    registered: dict[str, Adapter] = field(default_factory=dict)
    resident: OrderedDict[str, None] = field(default_factory=OrderedDict)  # LRU, newest last
    running: dict[str, int] = field(default_factory=dict)  # adapter -> requests in the batch
    loads: int = 0  # adapters read from disk (loads and re-reads)
    _next_id: int = 0
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str, path: str) -> str:
        if not name or not path:
            raise LoraError(
                400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."
            )
        async with self._lock(name):
            if name in self.registered:
                raise LoraError(
                    400,
                    "InvalidUserInput",
                    f"The lora adapter '{name}' has already been loaded. If you want to load "
                    "the adapter in place, set 'load_inplace' to True.",
                )
            if not self.config.enabled:
                raise LoraError(
                    400, "BadRequestError", "LoRA is not enabled. Use --enable-lora to enable LoRA."
                )
            rank = read_adapter(name, path, self.config.max_lora_rank)
            await self._read_in(name)
            self._next_id += 1
            self.registered[name] = Adapter(name, path, rank, self._next_id)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload(self, name: str) -> str:
        if not name:
            raise LoraError(
                400,
                "InvalidUserInput",
                "'lora_name' needs to be provided to unload a LoRA adapter.",
            )
        async with self._lock(name):
            if name not in self.registered:
                raise LoraError(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
            del self.registered[name]
            self.resident.pop(name, None)
        return f"Success: LoRA adapter '{name}' removed successfully."

    async def _read_in(self, name: str) -> None:
        """Read the adapter into host memory, pushing the least recently used out."""
        await asyncio.sleep(self.config.load_s)
        self.loads += 1
        self.resident[name] = None
        self.resident.move_to_end(name)
        while len(self.resident) > self.config.cpu_slots:
            self.resident.popitem(last=False)

    async def enter_batch(self, name: str) -> None:
        """Wait for a place in the batch (at most --max-loras adapters), reading the
        adapter in again if it was pushed out of host memory."""
        async with self._lock(name):
            if name not in self.resident:
                await self._read_in(name)
            else:
                self.resident.move_to_end(name)
        while not (name in self.running or len(self.running) < self.config.max_loras):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.running[name] = self.running.get(name, 0) + 1

    def leave_batch(self, name: str) -> None:
        left = self.running[name] - 1
        if left:
            self.running[name] = left
            return
        del self.running[name]
        for waiter in self._waiters:  # each looks again at what is running
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def cards(self, created: int) -> list[dict[str, object]]:
        """vLLM's model cards for the adapters: `root` their path, `parent` the base."""
        return [
            {
                "id": a.name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": a.path,
                "parent": self.base,
            }
            for a in self.registered.values()
        ]
