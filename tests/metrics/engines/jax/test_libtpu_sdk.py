"""libtpu's duty cycle from its SDK in the program (issue 40): a TPU device's busy %
is libtpu's when ``tpumonitoring.get_metric("duty_cycle_pct").data()`` has
data, marked so through the wire to the table; the hook's estimate, marked
``~``, when it returns ``[]`` (as in the TPU machine's sandbox), fails or is
missing. The SDK and the TPU device are fakes: CI has no TPU (and no libtpu)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from tests.fixtures.snapshots import header
from tests.tpu_info.host.test_sandbox_host import sandbox
from tpu_info.contract.model import DeviceRecord, MemoryReading, ProcessRecord, Snapshot
from tpu_info.outputs.jsonview import to_json
from tpu_info.outputs.render import render_text
from tpu_info.views.derived import readings
from tpu_info.views.values import TargetView
from tpu_info.wire.codec import snapshot_from_proto
from tpu_info.wire.fillers import snapshot_to_proto

pytest.importorskip("jax")

from metrics.engines.jax import devices as jax_devices  # noqa: E402
from metrics.engines.jax.libtpu_sdk import (  # noqa: E402
    EVERY_S,
    STALE_S,
    DutyCycle,
    with_duty_cycle,
)

LIMIT = 16_909_336_064  # the v5e's memory_stats() bytes_limit
NO_LIBTPU = TargetView("localhost:8431", error="cannot connect (no TCP here)", source="libtpu")
HOLDS = {4242: ["DEV/vfio/vfio", "DEV/vfio/0"]}


class FakeMonitoring(types.ModuleType):
    """``libtpu.sdk.tpumonitoring``: ``get_metric(name).data()`` returns ``answer``."""

    def __init__(self, answer: object) -> None:
        super().__init__("libtpu.sdk.tpumonitoring")
        self.answer = answer
        self.asked: list[str] = []

    def get_metric(self, name: str) -> types.SimpleNamespace:
        self.asked.append(name)
        if isinstance(self.answer, Exception):
            raise self.answer
        return types.SimpleNamespace(data=lambda: self.answer)


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Injects a fake ``libtpu.sdk.tpumonitoring``; returns a setter of its answer."""

    def install(answer: object) -> FakeMonitoring:
        mon = FakeMonitoring(answer)
        pkg, sub = types.ModuleType("libtpu"), types.ModuleType("libtpu.sdk")
        sub.tpumonitoring = mon  # type: ignore[attr-defined]
        pkg.sdk = sub  # type: ignore[attr-defined]
        for name, m in (("libtpu", pkg), ("libtpu.sdk", sub), ("libtpu.sdk.tpumonitoring", mon)):
            monkeypatch.setitem(sys.modules, name, m)
        return mon

    return install


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeTpu:
    """A ``jax.Device`` on a TPU as the hook reads it (CI has none)."""

    platform, device_kind = "tpu", "TPU v5 lite"

    def __init__(self, id: int) -> None:
        self.id = id

    def memory_stats(self) -> dict[str, int]:
        return {"bytes_in_use": 134_800_000, "peak_bytes_in_use": 140_000_000,
                "bytes_limit": LIMIT}


def _tpu_records(monkeypatch: pytest.MonkeyPatch, memory: jax_devices.DeviceMemory,
                 n: int = 1, busy: float | None = 11.0) -> list[DeviceRecord]:
    monkeypatch.setattr(jax_devices, "backends_started", lambda: True)
    monkeypatch.setattr(jax_devices.jax, "local_devices", lambda: [FakeTpu(i) for i in range(n)])
    return memory.records((busy, "" if busy is not None else "none counted yet"))


def _through_the_wire(devices: list[DeviceRecord]) -> TargetView:
    s = Snapshot(taken_at_unix=0.0, uptime_seconds=60.0,
                 process=ProcessRecord(pid=4242, name="train.py", host="tpu-vm-1", engine="jax"),
                 devices=tuple(devices))
    return TargetView("unix:/run/tpu-info/4242.sock", snapshot_from_proto(snapshot_to_proto(s)))


def _chip_line(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("tpu3")]
    return line


def test_the_sdks_duty_cycle_reaches_the_table_as_libtpus(sdk, monkeypatch, tmp_path: Path):
    mon = sdk(["87.5"])
    recs = _tpu_records(monkeypatch, jax_devices.DeviceMemory())
    assert [(r.busy_percent, r.busy_source, r.busy_reason) for r in recs] == [
        (87.5, "libtpu", "")]
    assert mon.asked == ["duty_cycle_pct"]
    view = _through_the_wire(recs)
    assert view.snapshot is not None and view.snapshot.devices[0].busy_source == "libtpu"
    scan, _ = sandbox(tmp_path, HOLDS)
    out = render_text([NO_LIBTPU, view], 160, local=scan, header=header())
    row = _chip_line(out)
    assert "88%" in row and "~" not in row and "4242 train.py" in row
    flat = " ".join(out.split())
    assert "busy % of tpu3: libtpu's duty cycle, read in pid 4242 by its hook" in flat
    assert "the hook's estimate" not in flat
    run = readings([NO_LIBTPU, view], local=scan, header=header())
    assert run.usage[3].busy_source == "libtpu" and not run.chips[0].busy_estimated
    doc = to_json([NO_LIBTPU, view], local=scan, header=header())
    assert doc["chips"][3]["busy_source"] == "libtpu"
    assert doc["targets"][1]["devices"][0]["busy_source"] == "libtpu"


def test_an_empty_answer_keeps_the_estimate_labelled(sdk, monkeypatch, tmp_path: Path):
    sdk([])  # what the TPU machine's sandbox returned for every metric
    memory = jax_devices.DeviceMemory()
    recs = _tpu_records(monkeypatch, memory)
    assert [(r.busy_percent, r.busy_source) for r in recs] == [(11.0, "estimate")]
    assert "returned no usable duty_cycle_pct ([])" in memory.duty.why
    scan, _ = sandbox(tmp_path, HOLDS)
    out = render_text([NO_LIBTPU, _through_the_wire(recs)], 160, local=scan, header=header())
    assert "~11%" in _chip_line(out)
    assert "~ busy %: the hook's estimate, not libtpu's duty cycle" in " ".join(out.split())


def test_an_older_hook_without_a_source_reads_as_an_estimate(tmp_path: Path):
    dev = DeviceRecord(0, "TPU v5 lite", "tpu", MemoryReading(1, 1, LIMIT, "memory_stats"),
                       busy_percent=42.0)  # busy_source "": not said
    scan, _ = sandbox(tmp_path, HOLDS)
    out = render_text([NO_LIBTPU, _through_the_wire([dev])], 160, local=scan, header=header())
    assert "~42%" in _chip_line(out)


@pytest.mark.parametrize("answer", [RuntimeError("no metrics service"), ["87", "abc"], ["nan"],
                                    ["150"], "87", None])
def test_failures_and_nonsense_are_counted_or_ignored_never_raised(sdk, monkeypatch, answer):
    sdk(answer)
    failed: list[tuple[str, BaseException]] = []
    memory = jax_devices.DeviceMemory(on_error=lambda where, e: failed.append((where, e)))
    (rec,) = _tpu_records(monkeypatch, memory)
    assert (rec.busy_percent, rec.busy_source) == (11.0, "estimate")
    raised = isinstance(answer, Exception)
    assert memory.duty.errors == len(failed) == int(raised)
    assert memory.duty.why


def test_no_sdk_here_is_asked_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # import libtpu raises ImportError
    memory = jax_devices.DeviceMemory()
    for _ in range(3):
        (rec,) = _tpu_records(monkeypatch, memory)
        assert rec.busy_source == "estimate"
    assert memory.duty.asks == 0 and memory.duty.errors == 0
    assert "not importable" in memory.duty.why


def test_not_a_tpu_never_imports_the_sdk(sdk):
    mon = sdk(["50"])
    jax_devices.jax.local_devices()  # the CPU backend of the test run, started
    memory = jax_devices.DeviceMemory()
    recs = memory.records((5.0, ""))
    assert recs and all(r.platform != "tpu" and r.busy_source == "estimate" for r in recs)
    assert mon.asked == [] and memory.duty.asks == 0


def test_asked_at_most_every_few_seconds_and_forgotten_when_stale(sdk):
    mon = sdk(["30"])
    clock = Clock()
    duty = DutyCycle(clock=clock)
    assert duty.per_chip() == (30.0,)
    for _ in range(50):  # a dashboard at 10 Hz: one ask
        clock.t += 0.1
        assert duty.per_chip() == (30.0,)
    assert len(mon.asked) == 1
    clock.t += EVERY_S
    mon.answer = ["40"]
    assert duty.per_chip() == (40.0,) and len(mon.asked) == 2
    mon.answer = []  # the chip went quiet for libtpu: the estimate at once
    clock.t += EVERY_S
    assert duty.per_chip() == ()
    mon.answer = RuntimeError("hung up")
    clock.t += STALE_S + EVERY_S
    assert duty.per_chip() == () and duty.errors == 1


def test_a_scrape_never_waits_for_another_ask(sdk):
    mon = sdk(["30"])
    duty = DutyCycle()
    with duty._lock:  # another scrape is asking the SDK right now
        assert duty.per_chip() == ()
    assert mon.asked == []


def test_values_go_to_chips_in_device_order():
    def rec(i: int, platform: str = "tpu") -> DeviceRecord:
        return DeviceRecord(i, "TPU", platform, MemoryReading(None), busy_percent=5.0)

    one = with_duty_cycle([rec(1), rec(0)], [10.0, 20.0])
    assert [(r.id, r.busy_percent, r.busy_source) for r in one] == [
        (1, 20.0, "libtpu"), (0, 10.0, "libtpu")]
    two_cores = with_duty_cycle([rec(i) for i in range(4)], [10.0, 20.0])
    assert [r.busy_percent for r in two_cores] == [10.0, 10.0, 20.0, 20.0]
    unclear = with_duty_cycle([rec(i) for i in range(3)], [10.0, 20.0])
    assert {(r.busy_percent, r.busy_source) for r in unclear} == {(5.0, "estimate")}
    cpu = with_duty_cycle([rec(0, "cpu")], [10.0])
    assert (cpu[0].busy_percent, cpu[0].busy_source) == (5.0, "estimate")
