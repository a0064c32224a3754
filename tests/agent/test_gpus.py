from __future__ import annotations

import threading
import time

import pynvml
import pytest

from llmgw.agent.fake_gpus import FakeGpus, parse_fake_spec
from llmgw.agent.gpus import (
    DEFAULT_IGNORED_XIDS,
    NvmlGpus,
    gpu_class,
)
from llmgw.wire import GpuHealth, GpuReport

from .nvml_fake import Card, FakeNvml


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(cards=[Card(f"GPU-{i}") for i in range(4)])
    fake.install(monkeypatch)
    return fake


def scan(source: NvmlGpus) -> dict[str, GpuReport]:
    result = source.scan()
    assert result.error is None
    return {g.uuid: g for g in result.gpus}


# -- class names ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "mib", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-PCIE-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-NVL-94GB"),
        ("NVIDIA H200", 143771, "H200-SXM-140GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-SXM-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-SXM-40GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-PCIE-80GB"),
        ("NVIDIA L40S", 46068, "L40S-45GB"),
        ("Tesla T4", 15360, "T4-15GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX-4090-24GB"),
        ("NVIDIA RTX A6000", 49140, "RTX-A6000-48GB"),
        (b"NVIDIA B200".decode(), 183359, "B200-SXM-179GB"),
    ],
)
def test_class_is_normalised_name_plus_rounded_gib(name: str, mib: int, expected: str) -> None:
    assert gpu_class(name, mib) == expected


# -- no NVML ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (pynvml.NVMLError_LibraryNotFound, "libnvidia-ml.so.1 not found"),
        (pynvml.NVMLError_DriverNotLoaded, "driver is not loaded"),
        (pynvml.NVMLError_NoPermission, "initialisation failed"),
    ],
)
def test_no_nvml_is_zero_gpus_and_a_reason(
    nvml: FakeNvml, error: type[pynvml.NVMLError], words: str
) -> None:
    nvml.init_error = error
    source = NvmlGpus(watch_xids=False)
    result = source.scan()
    assert result.gpus == []
    assert result.error is not None and words in result.error
    # It retries later: a driver loaded after the agent started is picked up.
    nvml.init_error = None
    assert len(source.scan().gpus) == 4
    assert nvml.init_calls == 2


def test_real_library_missing_is_reported_not_raised() -> None:
    # No patching: this machine has no NVIDIA driver at all.
    source = NvmlGpus(watch_xids=False)
    result = source.scan()
    source.close()
    if result.error is None:
        pytest.skip("this machine has NVML")
    assert result.gpus == [] and "no NVML" in result.error


def test_count_failure_is_a_reason(nvml: FakeNvml) -> None:
    nvml.count_error = pynvml.NVMLError_Unknown
    result = NvmlGpus(watch_xids=False).scan()
    assert result.gpus == [] and result.error and "could not count" in result.error


def test_driver_gone_means_initialise_again(nvml: FakeNvml) -> None:
    source = NvmlGpus()
    try:
        assert len(source.scan().gpus) == 4
        nvml.count_error = pynvml.NVMLError_DriverNotLoaded  # driver unloaded under us
        result = source.scan()
        assert result.gpus == [] and result.error and "could not count" in result.error
        nvml.count_error = None  # reloaded
        assert len(source.scan().gpus) == 4
        assert nvml.init_calls == 2
    finally:
        source.close()


# -- healthy baseline and readings --------------------------------------------------


def test_healthy_cards_with_memory_utilisation_and_in_use(nvml: FakeNvml) -> None:
    nvml.cards[1].processes = 2
    nvml.cards[1].used_mib = 40000
    nvml.cards[1].util = 77
    gpus = scan(NvmlGpus(watch_xids=False))
    assert list(gpus) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert all(g.health is GpuHealth.HEALTHY and g.health_reason is None for g in gpus.values())
    assert gpus["GPU-1"].in_use and not gpus["GPU-0"].in_use
    assert gpus["GPU-1"].memory_used_mib == 40000 and gpus["GPU-1"].utilization_pct == 77
    assert gpus["GPU-0"].gpu_class == "H100-SXM-80GB" and gpus["GPU-0"].memory_total_mib == 81559


def test_processes_say_what_each_holds_per_card(nvml: FakeNvml) -> None:
    # What a sleep is checked against (llmgw.agent.sleep_check): NVML's running processes.
    nvml.cards[0].held = [(4242, 16384), (77, None)]  # 77: NVML cannot tell (a container)
    nvml.cards[2].held = [(4243, 512)]
    nvml.cards[3].processes = 1  # a process listed without a memory field at all
    nvml.cards[1].errors = {"nvmlDeviceGetComputeRunningProcesses": pynvml.NVMLError_GpuIsLost}
    source = NvmlGpus(watch_xids=False)
    got = [(p.pid, p.gpu_uuid, p.used_mib) for p in source.processes()]
    assert got == [(4242, "GPU-0", 16384), (4243, "GPU-2", 512)]
    nvml.init_error = pynvml.NVMLError_LibraryNotFound
    assert NvmlGpus(watch_xids=False).processes() == []  # no NVML: nothing, not an error


# -- health rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"ecc_uncorrected": 3}, "3 uncorrectable ECC"),
        ({"remap": (0, 1, 0, 1)}, "row remapping failed"),
        ({"remap": (2, 1, 1, 0)}, "row remap pending"),
        ({"recovery_action": pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT}, "reboot the node"),
        ({"recovery_action": pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET}, "reset the GPU"),
    ],
)
def test_each_health_rule_makes_the_card_unhealthy_with_a_reason(
    nvml: FakeNvml, change: dict[str, object], words: str
) -> None:
    for key, value in change.items():
        setattr(nvml.cards[2], key, value)
    gpus = scan(NvmlGpus(watch_xids=False))
    assert gpus["GPU-2"].health is GpuHealth.UNHEALTHY
    assert words in (gpus["GPU-2"].health_reason or "")
    assert all(gpus[u].health is GpuHealth.HEALTHY for u in ("GPU-0", "GPU-1", "GPU-3"))


def test_retired_pages_pending_on_cards_without_row_remapping(nvml: FakeNvml) -> None:
    card = nvml.cards[0]
    card.errors["nvmlDeviceGetRemappedRows"] = pynvml.NVMLError_NotSupported
    source = NvmlGpus(watch_xids=False)
    assert scan(source)["GPU-0"].health is GpuHealth.HEALTHY  # page retirement readable
    card.retired_pending = 1
    gpu = scan(source)["GPU-0"]
    assert gpu.health is GpuHealth.UNHEALTHY and "retired pages pending" in (
        gpu.health_reason or ""
    )


@pytest.mark.parametrize(
    "unsupported",
    [
        ["nvmlDeviceGetTotalEccErrors"],
        ["nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus"],
    ],
)
def test_not_supported_reading_is_unknown_never_healthy(
    nvml: FakeNvml, unsupported: list[str]
) -> None:
    for fn in unsupported:
        nvml.cards[0].errors[fn] = pynvml.NVMLError_NotSupported
    gpu = scan(NvmlGpus(watch_xids=False))["GPU-0"]
    assert gpu.health is GpuHealth.UNKNOWN
    assert gpu.health_reason


def test_unhealthy_wins_over_unknown(nvml: FakeNvml) -> None:
    nvml.cards[0].errors["nvmlDeviceGetTotalEccErrors"] = pynvml.NVMLError_NotSupported
    nvml.cards[0].remap = (0, 0, 0, 1)
    assert scan(NvmlGpus(watch_xids=False))["GPU-0"].health is GpuHealth.UNHEALTHY


def test_recovery_action_field_missing_on_old_driver_adds_nothing(nvml: FakeNvml) -> None:
    nvml.cards[0].recovery_action = None
    nvml.cards[1].errors["nvmlDeviceGetFieldValues"] = pynvml.NVMLError_FunctionNotFound
    gpus = scan(NvmlGpus(watch_xids=False))
    assert gpus["GPU-0"].health is GpuHealth.HEALTHY
    assert gpus["GPU-1"].health is GpuHealth.HEALTHY


# -- lost cards ---------------------------------------------------------------------------


def test_lost_gpu_does_not_stop_enumeration(nvml: FakeNvml) -> None:
    source = NvmlGpus(watch_xids=False)
    scan(source)  # learn the cards
    nvml.cards[1].errors["*"] = pynvml.NVMLError_GpuIsLost
    nvml.handle_errors[2] = pynvml.NVMLError_GpuIsLost
    gpus = scan(source)
    assert list(gpus) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    for uid in ("GPU-1", "GPU-2"):
        assert gpus[uid].health is GpuHealth.UNHEALTHY
        assert "lost" in (gpus[uid].health_reason or "")
        assert gpus[uid].gpu_class == "H100-SXM-80GB"  # remembered from the earlier scan
    assert gpus["GPU-0"].health is GpuHealth.HEALTHY
    assert gpus["GPU-3"].health is GpuHealth.HEALTHY


def test_other_read_errors_make_one_card_unknown_not_the_scan_fail(nvml: FakeNvml) -> None:
    source = NvmlGpus(watch_xids=False)
    scan(source)
    nvml.cards[0].errors["nvmlDeviceGetMemoryInfo"] = pynvml.NVMLError_Unknown
    nvml.cards[2].errors["nvmlDeviceGetMaxMigDeviceCount"] = pynvml.NVMLError_NoPermission
    nvml.cards[2].mig = True
    nvml.handle_errors[3] = pynvml.NVMLError_InsufficientPower
    gpus = scan(source)
    assert len(gpus) == 4
    assert gpus["GPU-0"].health is GpuHealth.UNKNOWN
    assert "cannot read" in (gpus["GPU-0"].health_reason or "")
    assert gpus["GPU-0"].gpu_class == "H100-SXM-80GB"  # remembered
    assert gpus["GPU-1"].health is GpuHealth.HEALTHY
    assert gpus["GPU-2"].health is GpuHealth.UNKNOWN
    assert gpus["GPU-3"].health is GpuHealth.UNKNOWN


def test_lost_before_first_scan_is_still_counted(nvml: FakeNvml) -> None:
    nvml.handle_errors[0] = pynvml.NVMLError_GpuIsLost
    result = NvmlGpus(watch_xids=False).scan()
    assert len(result.gpus) == 4
    assert result.gpus[0].health is GpuHealth.UNHEALTHY and result.gpus[0].index == 0


def test_card_fallen_off_the_bus_stays_in_the_report(nvml: FakeNvml) -> None:
    source = NvmlGpus(watch_xids=False)
    scan(source)
    del nvml.cards[3]  # the driver no longer enumerates it
    gpus = scan(source)
    assert len(gpus) == 4
    assert gpus["GPU-3"].health is GpuHealth.UNHEALTHY
    assert "fallen off the bus" in (gpus["GPU-3"].health_reason or "")


def test_reset_required_is_unhealthy(nvml: FakeNvml) -> None:
    nvml.cards[0].errors["nvmlDeviceGetTotalEccErrors"] = pynvml.NVMLError_ResetRequired
    gpu = scan(NvmlGpus(watch_xids=False))["GPU-0"]
    assert gpu.health is GpuHealth.UNHEALTHY and "needs a reset" in (gpu.health_reason or "")


# -- Xids ----------------------------------------------------------------------------------


def test_fatal_xid_is_unhealthy_and_application_xids_are_ignored(nvml: FakeNvml) -> None:
    source = NvmlGpus(watch_xids=False)
    for xid in sorted(DEFAULT_IGNORED_XIDS):
        assert source.record_xid("GPU-0", xid) is False
    assert scan(source)["GPU-0"].health is GpuHealth.HEALTHY
    assert source.record_xid("GPU-1", 79) is True
    gpu = scan(source)["GPU-1"]
    assert gpu.health is GpuHealth.UNHEALTHY
    assert "Xid 79" in (gpu.health_reason or "") and "fallen off the bus" in (
        gpu.health_reason or ""
    )


def test_ignored_xid_list_is_configurable(nvml: FakeNvml) -> None:
    source = NvmlGpus(ignored_xids={79}, watch_xids=False)
    assert source.record_xid("GPU-0", 79) is False
    assert source.record_xid("GPU-0", 13) is True  # no longer ignored
    assert scan(source)["GPU-0"].health is GpuHealth.UNHEALTHY


def test_xid_sticks_until_the_card_is_reset(nvml: FakeNvml) -> None:
    clock = [1000.0]
    source = NvmlGpus(watch_xids=False, clock=lambda: clock[0], recovered_note_s=60)
    scan(source)
    source.record_xid("GPU-0", 48)
    assert scan(source)["GPU-0"].health is GpuHealth.UNHEALTHY
    assert scan(source)["GPU-0"].health is GpuHealth.UNHEALTHY  # no reset seen: still bad
    # The driver asks for a reset ...
    nvml.cards[0].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert scan(source)["GPU-0"].health is GpuHealth.UNHEALTHY
    # ... the operator resets the card: it reads clean again.
    nvml.cards[0].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
    gpu = scan(source)["GPU-0"]
    assert gpu.health is GpuHealth.HEALTHY
    assert "healthy again after a reset" in (gpu.health_reason or "")
    assert "Xid 48" in (gpu.health_reason or "")
    clock[0] += 61
    assert scan(source)["GPU-0"].health_reason is None  # the note expires


def test_card_back_after_being_lost_is_healthy_and_says_so(nvml: FakeNvml) -> None:
    source = NvmlGpus(watch_xids=False)
    scan(source)
    source.record_xid("GPU-2", 79)
    nvml.cards[2].errors["*"] = pynvml.NVMLError_GpuIsLost
    assert scan(source)["GPU-2"].health is GpuHealth.UNHEALTHY
    nvml.cards[2].errors.clear()  # reset brought it back
    gpu = scan(source)["GPU-2"]
    assert gpu.health is GpuHealth.HEALTHY
    assert gpu.health_reason and gpu.health_reason.startswith("healthy again after a reset")


def test_event_thread_records_fatal_xids(nvml: FakeNvml) -> None:
    source = NvmlGpus()
    scan(source)  # starts the thread
    try:
        assert _wait_for(lambda: len(nvml.registered) == 4)
        nvml.xid(nvml.cards[0], 13)  # application error: ignored
        nvml.xid(nvml.cards[3], 94)
        assert _wait_for(lambda: not nvml.events)
        assert _wait_for(lambda: scan(source)["GPU-3"].health is GpuHealth.UNHEALTHY)
        assert scan(source)["GPU-0"].health is GpuHealth.HEALTHY
    finally:
        source.close()
    assert not any(t.name == "nvml-xid" for t in threading.enumerate())


def _wait_for(cond: object, timeout: float = 3.0) -> bool:
    assert callable(cond)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


# -- MIG --------------------------------------------------------------------------------------


def test_mig_slices_are_the_devices_and_the_card_is_not_counted_twice(nvml: FakeNvml) -> None:
    parent = nvml.cards[0]
    parent.mig = True
    parent.slices = [
        Card(f"MIG-{j}", name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", memory_mib=40192)
        for j in range(2)
    ]
    parent.slices[1].processes = 1
    gpus = scan(NvmlGpus(watch_xids=False))
    assert "GPU-0" not in gpus
    assert len(gpus) == 5  # 2 slices + 3 whole cards
    assert gpus["MIG-0"].mig_parent_uuid == "GPU-0"
    assert gpus["MIG-0"].gpu_class == "H100-SXM-80GB-MIG-3g.40gb"
    assert gpus["MIG-1"].in_use and not gpus["MIG-0"].in_use
    assert gpus["MIG-0"].health is GpuHealth.HEALTHY


def test_mig_slices_inherit_the_parent_health(nvml: FakeNvml) -> None:
    parent = nvml.cards[0]
    parent.mig = True
    parent.ecc_uncorrected = 1
    parent.slices = [Card("MIG-0", name="NVIDIA H100 80GB HBM3 MIG 7g.80gb")]
    gpu = scan(NvmlGpus(watch_xids=False))["MIG-0"]
    assert gpu.health is GpuHealth.UNHEALTHY and "ECC" in (gpu.health_reason or "")


def test_mig_on_without_slices_reports_the_card_once_as_unknown(nvml: FakeNvml) -> None:
    nvml.cards[0].mig = True
    gpus = scan(NvmlGpus(watch_xids=False))
    assert len(gpus) == 4
    assert gpus["GPU-0"].health is GpuHealth.UNKNOWN
    assert "no MIG devices" in (gpus["GPU-0"].health_reason or "")


# -- fake GPUs ------------------------------------------------------------------------------


def test_fake_spec_parses_count_class_and_unhealthy() -> None:
    group = parse_fake_spec("8xH100-80GB,unhealthy=3,5,busy=1")
    assert (group.count, group.gpu_class, group.memory_mib) == (8, "H100-80GB", 80 * 1024)
    assert group.unhealthy == {3, 5} and group.busy == {1}


@pytest.mark.parametrize(
    "bad", ["8H100", "0xH100-80GB", "8xH100-80GB,unhealthy=8", "8xH100,bogus=1", "8xH100,3"]
)
def test_bad_fake_spec_says_what_is_wrong(bad: str) -> None:
    with pytest.raises(ValueError, match="--fake-gpus"):
        parse_fake_spec(bad)


def test_fake_gpus_have_stable_uuids_per_node() -> None:
    groups = [parse_fake_spec("8xH100-80GB,unhealthy=3"), parse_fake_spec("2xA100-40GB")]
    a1, a2, b = FakeGpus("a", groups), FakeGpus("a", groups), FakeGpus("b", groups)
    assert a1.uuids == a2.uuids
    assert not set(a1.uuids) & set(b.uuids)
    gpus = a1.scan().gpus
    assert len(gpus) == 10 and len(set(a1.uuids)) == 10
    assert [g.index for g in gpus if g.health is GpuHealth.UNHEALTHY] == [3]
    assert gpus[9].gpu_class == "A100-40GB" and gpus[9].memory_total_mib == 40 * 1024


def test_only_the_nvml_module_imports_pynvml() -> None:
    """agent/gpus.py is the one module that touches NVML (simulation lives elsewhere)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"^\s*(import pynvml|from pynvml\b)", re.MULTILINE)
    importers = sorted(
        str(p.relative_to(root))
        for pkg in ("agent", "llmgw", "console")
        for p in (root / pkg).rglob("*.py")
        if pattern.search(p.read_text())
    )
    assert importers == ["agent/gpus.py"]


def test_fake_cards_something_runs_on_show_busy_with_memory_used() -> None:
    busy: set[str] = set()
    gpus = FakeGpus("n1", [parse_fake_spec("2xH100-SXM-80GB")], busy=lambda: busy)
    first = gpus.uuids[0]
    assert [g.in_use for g in gpus.scan().gpus] == [False, False]
    busy.add(first)
    scanned = gpus.scan().gpus
    assert [g.in_use for g in scanned] == [True, False]
    assert scanned[0].memory_used_mib and scanned[0].memory_used_mib > 0
    assert scanned[1].memory_used_mib == 0
