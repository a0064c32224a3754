"""A fake NVML device table, installed by patching the real `pynvml` module.

Only the C-calling functions are replaced; the exception classes and constants
are pynvml's own, so the code under test catches exactly what it would catch
on a real node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

MIB = 1 << 20


@dataclass
class Card:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    used_mib: int = 0
    util: int = 0
    processes: int = 0
    # (pid, MiB; None: NVML cannot tell, as in some containers) per process listed
    held: list[tuple[int, int | None]] = field(default_factory=list)
    ecc_uncorrected: int = 0
    remap: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    retired_pending: int = 0
    recovery_action: int | None = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    mig: bool = False
    slices: list[Card] = field(default_factory=list)
    # function name -> exception class raised when NVML is asked that on this card
    errors: dict[str, type[pynvml.NVMLError]] = field(default_factory=dict)

    def check(self, fn: str) -> None:
        if "*" in self.errors:
            raise self.errors["*"]()
        if fn in self.errors:
            raise self.errors[fn]()


@dataclass
class FakeNvml:
    cards: list[Card] = field(default_factory=list)
    init_error: type[pynvml.NVMLError] | None = None
    count_error: type[pynvml.NVMLError] | None = None
    handle_errors: dict[int, type[pynvml.NVMLError]] = field(default_factory=dict)
    init_calls: int = 0
    events: list[Any] = field(default_factory=list)  # pending Xid events
    registered: list[str] = field(default_factory=list)

    def install(self, mp: pytest.MonkeyPatch) -> None:
        def init() -> None:
            self.init_calls += 1
            if self.init_error is not None:
                raise self.init_error()

        def count() -> int:
            if self.count_error is not None:
                raise self.count_error()
            return len(self.cards)

        def handle(i: int) -> Card:
            if i in self.handle_errors:
                raise self.handle_errors[i]()
            return self.cards[i]

        def on(fn: str, get: Any) -> Any:
            def call(h: Card, *args: Any) -> Any:
                h.check(fn)
                return get(h, *args)

            return call

        def ecc(h: Card, error_type: int, counter: int) -> int:
            assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            assert counter == pynvml.NVML_VOLATILE_ECC
            return h.ecc_uncorrected

        def fields(h: Card, ids: list[int]) -> list[Any]:
            assert ids == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
            if h.recovery_action is None:
                return [SimpleNamespace(nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED, value=None)]
            value = SimpleNamespace(uiVal=h.recovery_action)
            return [SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=value)]

        def mig_handle(h: Card, j: int) -> Card:
            h.check("nvmlDeviceGetMigDeviceHandleByIndex")
            if j >= len(h.slices):
                raise pynvml.NVMLError_NotFound()
            return h.slices[j]

        def wait(_es: Any, _ms: int) -> Any:
            if self.events:
                return self.events.pop(0)
            raise pynvml.NVMLError_Timeout()

        def register(h: Card, _types: int, _es: Any) -> None:
            self.registered.append(h.uuid)

        patches: dict[str, Any] = {
            "nvmlInit": init,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": count,
            "nvmlDeviceGetHandleByIndex": handle,
            "nvmlDeviceGetUUID": on("nvmlDeviceGetUUID", lambda h: h.uuid),
            "nvmlDeviceGetName": on("nvmlDeviceGetName", lambda h: h.name),
            "nvmlDeviceGetMemoryInfo": on(
                "nvmlDeviceGetMemoryInfo",
                lambda h: SimpleNamespace(total=h.memory_mib * MIB, used=h.used_mib * MIB),
            ),
            "nvmlDeviceGetUtilizationRates": on(
                "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=h.util, memory=0)
            ),
            "nvmlDeviceGetComputeRunningProcesses": on(
                "nvmlDeviceGetComputeRunningProcesses",
                lambda h: (
                    [object()] * h.processes
                    + [
                        SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
                        for pid, mib in h.held
                    ]
                ),
            ),
            "nvmlDeviceGetTotalEccErrors": on("nvmlDeviceGetTotalEccErrors", ecc),
            "nvmlDeviceGetRemappedRows": on("nvmlDeviceGetRemappedRows", lambda h: h.remap),
            "nvmlDeviceGetRetiredPagesPendingStatus": on(
                "nvmlDeviceGetRetiredPagesPendingStatus", lambda h: h.retired_pending
            ),
            "nvmlDeviceGetFieldValues": on("nvmlDeviceGetFieldValues", fields),
            "nvmlDeviceGetMigMode": on("nvmlDeviceGetMigMode", lambda h: [int(h.mig), int(h.mig)]),
            "nvmlDeviceGetMaxMigDeviceCount": on("nvmlDeviceGetMaxMigDeviceCount", lambda h: 7),
            "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
            "nvmlEventSetCreate": lambda: object(),
            "nvmlDeviceRegisterEvents": register,
            "nvmlEventSetWait": wait,
            "nvmlEventSetFree": lambda _es: None,
        }
        for name, fn in patches.items():
            assert hasattr(pynvml, name), name  # patch only what really exists
            mp.setattr(pynvml, name, fn)

    def xid(self, card: Card, xid: int) -> None:
        self.events.append(
            SimpleNamespace(
                device=card,
                eventType=pynvml.nvmlEventTypeXidCriticalError,
                eventData=xid,
                gpuInstanceId=0,
                computeInstanceId=0,
            )
        )
