"""GPUs: enumeration, class, memory, utilisation and health, through NVML.

This is the only module in `agent` that imports `pynvml`. NVML is initialised
lazily, on the first scan, and re-tried on later scans while it fails: a node
whose driver is missing reports zero GPUs and a reason, and keeps running.

Health rules (DESIGN.md, "GPU"). A card is `unhealthy`, with the reason stated,
when any of these holds:

- a fatal Xid arrived on the event thread (Xids in `ignored_xids`, by default
  the application errors 13, 31, 43, 45, 68 and 109, are ignored);
- its volatile uncorrectable ECC count is above zero;
- row remapping failed, or a row remap is pending;
- retired pages are pending (cards without row remapping);
- the driver asks for a recovery action other than none;
- NVML says the GPU is lost or needs a reset, or a card seen earlier is no
  longer enumerated (fallen off the bus).

A core reading the card does not support makes it `unknown`, never healthy.
The core readings are the ECC count and memory repair (row remapping, or page
retirement on cards that predate it). The recovery-action field only exists on
recent drivers, so its absence adds nothing.

A fatal Xid sticks until the card is seen to go through a reset: it was lost
or asked for a recovery action after the Xid, and now reads fine. A card that
turns healthy again says so in `health_reason` for `recovered_note_s`.

MIG: when MIG mode is on, the slices are reported as the devices (with
`mig_parent_uuid`) and the parent card is not, so no card is counted twice.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

from llmgw.agent.fake_process_memory import ProcessMemory
from llmgw.wire import GpuHealth, GpuReport

log = logging.getLogger(__name__)

# Application errors (a user program faulted), not hardware faults.
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

XID_TEXT: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "row remapping event",
    64: "row remapping failure",
    68: "video decoder exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}

RECOVERY_TEXT: dict[int, str] = {
    pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET: "reset the GPU",
    pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT: "reboot the node",
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P: "drain peer-to-peer traffic",
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET: "drain and reset the GPU",
}

UNKNOWN_CLASS = "unknown"


@dataclass
class GpuScan:
    """One reading of the node's GPUs: the devices, or why there are none."""

    gpus: list[GpuReport]
    error: str | None = None


class GpuSource(Protocol):
    def scan(self) -> GpuScan: ...

    def processes(self) -> list[ProcessMemory]:
        """Per process and card, the memory it holds now (NVML's running processes)."""
        ...

    def close(self) -> None: ...


# -- class normalisation -------------------------------------------------------

_DROP_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_MEMORY_TYPE = re.compile(r"^(HBM\d?E?|GDDR\d+X?)$")
_MEMORY_SIZE = re.compile(r"^\d+GB$")
_FORM = {"SXM": "SXM", "SXM2": "SXM", "SXM4": "SXM", "SXM5": "SXM", "PCIE": "PCIE", "NVL": "NVL"}
# Products whose unsuffixed name is the SXM board (the PCIe/NVL boards say so).
_SXM_BY_DEFAULT = {"H100", "H200", "H800", "H20", "B100", "B200", "B300"}


def gpu_class(name: str, memory_total_mib: int) -> str:
    """Normalised product name plus memory rounded to GiB.

    "NVIDIA H100 80GB HBM3" (81559 MiB) -> "H100-SXM-80GB";
    "NVIDIA A100-SXM4-40GB" -> "A100-SXM-40GB"; "NVIDIA H100 PCIe" ->
    "H100-PCIE-80GB"; "Tesla T4" -> "T4-15GB". The memory figure is what the
    card reports, so two boards sold under one name but with different memory
    get different classes.
    """
    words = [w for w in re.split(r"[\s\-_]+", name.upper()) if w]
    words = [w for w in words if w not in _DROP_WORDS]
    words = [w for w in words if not _MEMORY_TYPE.match(w) and not _MEMORY_SIZE.match(w)]
    words = [_FORM.get(w, w) for w in words]
    words = [re.sub(r"[^A-Z0-9.]", "", w) for w in words]
    words = [w for w in words if w]
    if words and words[0] in _SXM_BY_DEFAULT and not any(w in _FORM.values() for w in words):
        words.insert(1, "SXM")
    base = "-".join(words) or "GPU"
    gib = round(memory_total_mib / 1024)
    return f"{base}-{gib}GB"[:64]


def _mig_class(parent_class: str, slice_name: str, memory_total_mib: int) -> str:
    match = re.search(r"MIG\s+(\S+)", slice_name)
    profile = match.group(1) if match else f"{round(memory_total_mib / 1024)}gb"
    return f"{parent_class}-MIG-{profile}"[:64]


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# -- NVML -----------------------------------------------------------------------


@dataclass
class _Known:
    """What we last read from a physical card, for reporting it once it is lost."""

    uuid: str
    index: int
    name: str
    gpu_class: str
    memory_total_mib: int

    def report(self, health: GpuHealth, reason: str) -> GpuReport:
        """A report of the card by what we knew of it, since it cannot be read now."""
        return GpuReport(
            uuid=self.uuid,
            index=self.index,
            name=self.name,
            gpu_class=self.gpu_class,
            memory_total_mib=self.memory_total_mib,
            health=health,
            health_reason=reason,
        )


class _Lost(Exception):
    """The card stopped answering mid-read."""


def _lost_reason(exc: pynvml.NVMLError) -> str:
    if isinstance(exc, pynvml.NVMLError_GpuIsLost):
        return "GPU is lost: fallen off the bus or hung; reset the GPU or reboot the node"
    if isinstance(exc, pynvml.NVMLError_ResetRequired):
        return "GPU needs a reset before it can be used again"
    return f"NVML cannot read this GPU: {exc}"


_LOST_ERRORS = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)
_DRIVER_GONE = (
    pynvml.NVMLError_Uninitialized,
    pynvml.NVMLError_DriverNotLoaded,
    pynvml.NVMLError_LibRmVersionMismatch,
)


class NvmlGpus:
    """The node's real GPUs, through NVML. Thread-safe `scan`."""

    def __init__(
        self,
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
        *,
        watch_xids: bool = True,
        clock: Callable[[], float] = time.monotonic,
        recovered_note_s: float = 3600.0,
    ) -> None:
        self.ignored_xids = frozenset(ignored_xids)
        self._watch = watch_xids
        self._clock = clock
        self._note_s = recovered_note_s
        self._lock = threading.Lock()
        self._xid_lock = threading.Lock()
        self._initialised = False
        self._init_error_logged: str | None = None
        self._xids: dict[str, tuple[int, str]] = {}  # uuid -> latest fatal Xid
        self._needs_reset_seen: set[str] = set()  # troubled since the Xid: lost or asked for it
        self._last_health: dict[str, tuple[GpuHealth, str | None]] = {}
        self._recovered: dict[str, tuple[float, str]] = {}  # uuid -> (when, what it was)
        self._known: dict[str, _Known] = {}  # physical cards seen, by uuid
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --

    def _ensure_init(self) -> str | None:
        if self._initialised:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            reason = "no NVML: libnvidia-ml.so.1 not found (is the NVIDIA driver installed?)"
        except pynvml.NVMLError_DriverNotLoaded:
            reason = "no NVML: the NVIDIA kernel driver is not loaded"
        except pynvml.NVMLError as exc:
            reason = f"no NVML: initialisation failed: {exc}"
        except OSError as exc:
            reason = f"no NVML: {exc}"
        else:
            self._initialised = True
            self._init_error_logged = None
            if self._watch:
                self._start_xid_thread()
            return None
        if reason != self._init_error_logged:  # log once per distinct reason
            log.warning("%s; reporting zero GPUs and retrying each cycle", reason)
            self._init_error_logged = reason
        return reason

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._initialised:
            self._initialised = False
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    # -- Xid events --

    def record_xid(self, uuid: str, xid: int) -> bool:
        """Note an Xid on a card; returns whether it counts as fatal."""
        if xid in self.ignored_xids:
            return False
        text = XID_TEXT.get(xid, "critical error")
        # Its own lock: `scan` may join this thread while holding `_lock`.
        with self._xid_lock:
            self._xids[uuid] = (xid, text)
            self._needs_reset_seen.discard(uuid)
        log.warning("GPU %s: fatal Xid %d (%s)", uuid, xid, text)
        return True

    def _start_xid_thread(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch_xids, name="nvml-xid", daemon=True)
        self._thread.start()

    def _watch_xids(self) -> None:
        try:
            events = pynvml.nvmlEventSetCreate()
            for i in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                    pynvml.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, events
                    )
                except pynvml.NVMLError as exc:
                    log.info("GPU %d: Xid events unavailable (%s)", i, exc)
        except pynvml.NVMLError as exc:
            log.warning("Xid event thread not started: %s", exc)
            return
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait(events, 500)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    log.warning("Xid event wait failed: %s; retrying", exc)
                    self._stop.wait(1.0)
                    continue
                if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    continue
                try:
                    uid = _text(pynvml.nvmlDeviceGetUUID(data.device))
                except pynvml.NVMLError:
                    continue
                self.record_xid(uid, int(data.eventData))
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(events)

    # -- scanning --

    def scan(self) -> GpuScan:
        with self._lock:
            error = self._ensure_init()
            if error:
                return GpuScan([], error)
            try:
                count = pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError as exc:
                if isinstance(exc, _DRIVER_GONE):
                    self.close()  # initialise afresh next scan (driver reloaded?)
                return GpuScan([], f"NVML could not count the GPUs: {exc}")
            gpus: list[GpuReport] = []
            seen: set[str] = set()
            for index in range(count):
                for report in self._read_card(index):
                    gpus.append(report)
                    seen.add(report.mig_parent_uuid or report.uuid)
            for known in self._known.values():
                if known.uuid not in seen:
                    gpus.append(
                        self._lost(
                            known,
                            "GPU no longer enumerated by the driver: fallen off the bus?",
                        )
                    )
            return GpuScan([self._note_transition(g) for g in gpus])

    def processes(self) -> list[ProcessMemory]:
        """Per compute process and card, the memory NVML says it holds: what the engine
        supervisor reads after a sleep (issue 32). Empty without NVML. A process whose
        memory NVML cannot tell (no permission, or `usedGpuMemory` unavailable, as in
        some containers) is left out: unknown is never zero."""
        with self._lock:
            if self._ensure_init():
                return []
            out: list[ProcessMemory] = []
            try:
                count = pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError:
                return []
            for index in range(count):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    uid = _text(pynvml.nvmlDeviceGetUUID(handle))
                    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                except pynvml.NVMLError:
                    continue  # a lost card: `scan` says so
                for p in procs:
                    used = getattr(p, "usedGpuMemory", None)
                    if isinstance(used, int) and used >= 0:
                        out.append(ProcessMemory(int(p.pid), uid, used // (1024 * 1024)))
            return sorted(out, key=lambda p: (p.gpu_uuid, p.pid))

    def _lost(self, known: _Known, reason: str) -> GpuReport:
        self._needs_reset_seen.add(known.uuid)
        return known.report(GpuHealth.UNHEALTHY, reason)

    def _known_at(self, index: int) -> _Known | None:
        return next((k for k in self._known.values() if k.index == index), None)

    def _read_card(self, index: int) -> list[GpuReport]:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            # We cannot even name the card: report it by what we knew of it.
            known = self._known_at(index) or _Known(
                f"unidentified-gpu-{index}", index, "", UNKNOWN_CLASS, 0
            )
            return [self._unreadable(known, exc)]
        try:
            return self._read_identified(index, handle, uid)
        except Exception as exc:  # one card's trouble never stops the others
            known = self._known.get(uid) or _Known(uid, index, "", UNKNOWN_CLASS, 0)
            return [self._unreadable(known, exc)]

    def _unreadable(self, known: _Known, exc: Exception) -> GpuReport:
        """Lost or needing a reset: unhealthy. Any other failed reading: unknown."""
        if isinstance(exc, _LOST_ERRORS):
            return self._lost(known, _lost_reason(exc))
        log.debug("GPU %s unreadable", known.uuid, exc_info=exc)
        what = str(exc) if isinstance(exc, pynvml.NVMLError) else f"{type(exc).__name__}: {exc}"
        return known.report(GpuHealth.UNKNOWN, f"NVML cannot read this GPU: {what}"[:4096])

    def _read_identified(self, index: int, handle: Any, uid: str) -> list[GpuReport]:
        name = _text(pynvml.nvmlDeviceGetName(handle))
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        total_mib = int(memory.total) // (1 << 20)
        cls = gpu_class(name, total_mib)
        self._known[uid] = _Known(uid, index, name, cls, total_mib)
        health, reason = self._health(handle, uid)

        if self._mig_enabled(handle):
            slices = self._read_slices(index, handle, uid, cls, health, reason)
            if slices:
                return slices
            health, reason = GpuHealth.UNKNOWN, "MIG mode is on but no MIG devices are configured"

        return [
            GpuReport(
                uuid=uid,
                index=index,
                name=name,
                gpu_class=cls,
                memory_total_mib=total_mib,
                memory_used_mib=int(memory.used) // (1 << 20),
                utilization_pct=_utilisation(handle),
                in_use=_in_use(handle),
                health=health,
                health_reason=reason,
            )
        ]

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except _LOST_ERRORS:
            raise
        except pynvml.NVMLError:  # NotSupported: not a MIG-capable card
            return False
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _read_slices(
        self,
        index: int,
        handle: Any,
        parent: str,
        parent_class: str,
        health: GpuHealth,
        reason: str | None,
    ) -> list[GpuReport]:
        slices: list[GpuReport] = []
        for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
                continue  # empty slot
            uid = _text(pynvml.nvmlDeviceGetUUID(mig))
            name = _text(pynvml.nvmlDeviceGetName(mig))
            memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
            total_mib = int(memory.total) // (1 << 20)
            slice_health, slice_reason = health, reason
            with_xid = self._xids.get(uid)
            if with_xid and health is not GpuHealth.UNHEALTHY:
                slice_health, slice_reason = GpuHealth.UNHEALTHY, _xid_reason(with_xid)
            slices.append(
                GpuReport(
                    uuid=uid,
                    index=index,
                    name=name,
                    gpu_class=_mig_class(parent_class, name, total_mib),
                    memory_total_mib=total_mib,
                    memory_used_mib=int(memory.used) // (1 << 20),
                    utilization_pct=None,  # NVML does not report it per slice
                    in_use=_in_use(mig),
                    health=slice_health,
                    health_reason=slice_reason,
                    mig_parent_uuid=parent,
                )
            )
        return slices

    def _health(self, handle: Any, uid: str) -> tuple[GpuHealth, str | None]:
        problems: list[str] = []
        unknown: list[str] = []

        try:
            ecc = pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
            if ecc > 0:
                problems.append(f"{ecc} uncorrectable ECC error(s) since the driver loaded")
        except _LOST_ERRORS:
            raise
        except pynvml.NVMLError_NotSupported:
            unknown.append("ECC error counts not supported (is ECC off?)")
        except pynvml.NVMLError as exc:
            unknown.append(f"ECC error counts unreadable: {exc}")

        try:
            _corr, _unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
            if failure:
                problems.append("row remapping failed: memory cannot be repaired, replace the card")
            if pending:
                problems.append("row remap pending: reset the GPU to apply it")
        except _LOST_ERRORS:
            raise
        except pynvml.NVMLError:
            # Cards before Ampere retire pages instead of remapping rows.
            try:
                if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                    problems.append("retired pages pending: reset the GPU to retire them")
            except _LOST_ERRORS:
                raise
            except pynvml.NVMLError:
                unknown.append("neither row remapping nor page retirement is readable")

        action = _recovery_action(handle)
        if action is not None and action != pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
            text = RECOVERY_TEXT.get(action, f"recovery action {action}")
            problems.append(f"driver asks to {text}")
            self._needs_reset_seen.add(uid)

        xid = self._xids.get(uid)
        if xid is not None:
            if uid in self._needs_reset_seen and not problems:
                # It went through a reset since the Xid and reads clean now.
                del self._xids[uid]
                self._needs_reset_seen.discard(uid)
            else:
                problems.insert(0, _xid_reason(xid))
        else:
            self._needs_reset_seen.discard(uid)

        if problems:
            return GpuHealth.UNHEALTHY, "; ".join(problems)
        if unknown:
            return GpuHealth.UNKNOWN, "; ".join(unknown)
        return GpuHealth.HEALTHY, None

    def _note_transition(self, gpu: GpuReport) -> GpuReport:
        """Say so when an unhealthy card is healthy again (after a reset)."""
        now = self._clock()
        before = self._last_health.get(gpu.uuid)
        self._last_health[gpu.uuid] = (gpu.health, gpu.health_reason)
        if gpu.health is not GpuHealth.HEALTHY:
            self._recovered.pop(gpu.uuid, None)
            return gpu
        if before is not None and before[0] is GpuHealth.UNHEALTHY:
            self._recovered[gpu.uuid] = (now, before[1] or "unhealthy")
        note = self._recovered.get(gpu.uuid)
        if note is None:
            return gpu
        if now - note[0] > self._note_s:
            del self._recovered[gpu.uuid]
            return gpu
        return gpu.model_copy(
            update={"health_reason": f"healthy again after a reset; was: {note[1]}"}
        )


def _xid_reason(xid: tuple[int, str]) -> str:
    return f"fatal Xid {xid[0]} ({xid[1]}): reset the GPU or reboot the node"


def _recovery_action(handle: Any) -> int | None:
    try:
        values = pynvml.nvmlDeviceGetFieldValues(
            handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        )
    except _LOST_ERRORS:
        raise
    except pynvml.NVMLError:
        return None  # older drivers: the field does not exist
    value = values[0]
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    return int(value.value.uiVal)


def _utilisation(handle: Any) -> int | None:
    try:
        return max(0, min(100, int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)))
    except _LOST_ERRORS:
        raise
    except pynvml.NVMLError:
        return None


def _in_use(handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except _LOST_ERRORS:
        raise
    except pynvml.NVMLError:
        return False
