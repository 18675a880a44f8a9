"""The dashboard's Devices panel on the TPU machine as it is (issue 40): the host
scan of the real machine's sysfs tree (four PCI functions, only /dev/vfio/0
here: the fourth is usable, JAX's TPU_0), no libtpu service (no TCP), and a
hooked JAX program holding the chip. The panel lists that chip as the table
does: its owner (pid and name), the program's HBM with the runtime's total,
busy % marked ~ as the hook's estimate (or libtpu's duty cycle, unmarked,
when the hook read libtpu's SDK), and counts the three chips not usable here;
``--all`` lists them. Pilot tests of the real app, and its layout at 80x24 and
160x45."""

from __future__ import annotations

import os
from datetime import UTC
from pathlib import Path

import pytest
from rich.text import Text

from tests.tpu_info.host.test_sandbox_host import sandbox
from tests.tui.waiting import until_drawn
from tpu_info.contract.model import (
    DeviceRecord,
    LocalScan,
    MemoryReading,
    ProcessRecord,
    Snapshot,
)
from tui.app import WatchApp
from tui.fake import NOW, FakeSource, FrozenClock
from tui.source import Conn, DiscoveryLoop, Found, Update
from tui.widgets.devices import DevicesPanel

HOST = "tpu-vm-1"
TARGET = "unix:/run/tpu-info/1624.sock"
LIMIT = 16_909_336_064  # memory_stats()['bytes_limit'] on the v5e: 15.75 GiB
USED = 32_000_000
HOLDS = {1624: ["DEV/vfio/vfio", "DEV/vfio/0"]}
WHO = {1624: ("python3", os.getuid(), ["python3", "prog.py"])}


def snapshot(t: float, busy: float = 11.0, source: str = "estimate") -> Snapshot:
    return Snapshot(
        taken_at_unix=t, uptime_seconds=60.0,
        process=ProcessRecord(pid=1624, name="prog.py", host=HOST, user="alice", engine="jax",
                              start_time_unix=NOW - 60),
        devices=(DeviceRecord(id=0, kind="TPU v5 lite", platform="tpu",
                              memory=MemoryReading(USED, USED, LIMIT, "memory_stats"),
                              busy_percent=busy, busy_source=source),))


def source(scan: LocalScan, frames: int = 20, **kw: object) -> FakeSource:
    out: list[Update | Found] = [Found(((TARGET, ("python3", "prog.py")),), local=scan)]
    out += [Update(TARGET, Conn.STREAMING, snapshot(NOW - frames + k, **kw))  # type: ignore[arg-type]
            for k in range(frames)]
    return FakeSource(out)


def app(scan: LocalScan, all_chips: bool = False, **kw: object) -> WatchApp:
    return WatchApp(source(scan, **kw), 1.0, clock=FrozenClock(), tz=UTC, tick_s=None,
                    all_chips=all_chips, host=HOST)


def plain(panel: DevicesPanel, key: str, column: str) -> str:
    cell = panel.get_cell(key, column)
    return cell.plain if isinstance(cell, Text) else str(cell)


@pytest.fixture
def scan(tmp_path: Path) -> LocalScan:
    return sandbox(tmp_path, HOLDS, WHO)[0]


async def test_the_chip_shows_with_its_owner_and_hbm(scan: LocalScan):
    a = app(scan)
    async with a.run_test(size=(160, 45)) as pilot:
        panel = a.main.query_one(DevicesPanel)
        await until_drawn(pilot, lambda: "chip|tpu3" in panel.row_keys)
        # The process's tpu:0 is that chip (joined by owner): not a row of its own.
        assert [k for k in panel.row_keys if k != "__events__"] == ["chip|tpu3"]
        assert plain(panel, "chip|tpu3", "owner") == "1624 prog.py"
        assert plain(panel, "chip|tpu3", "hbm") == "0.03/15.75 GiB"
        assert plain(panel, "chip|tpu3", "busy") == "~11%"
        assert set(plain(panel, "chip|tpu3", "hbm_hist")) <= set(" ▁▂▃▄▅▆▇█")
        assert panel.border_subtitle == ("~: hook's estimate · 3 more TPU chips not usable "
                                         "here (--all)")
        tip = str(panel.tooltip)
        assert "HBM of tpu3: from pid 1624's hook" in tip
        assert "no " in tip and "vfio/2" in tip  # the chips not listed, by their nodes


async def test_all_lists_every_chip(scan: LocalScan):
    a = app(scan, all_chips=True)
    async with a.run_test(size=(160, 45)) as pilot:
        panel = a.main.query_one(DevicesPanel)
        await until_drawn(pilot, lambda: "chip|tpu3" in panel.row_keys)
        assert [k for k in panel.row_keys if k.startswith("chip|")] == [
            f"chip|tpu{i}" for i in range(4)]
        assert plain(panel, "chip|tpu0", "hbm") == "N/A/16.00 GiB"  # nominal, no owner
        assert "not usable" not in (panel.border_subtitle or "")


async def test_libtpus_duty_cycle_from_the_hook_is_not_an_estimate(scan: LocalScan):
    a = app(scan, busy=87.0, source="libtpu")
    async with a.run_test(size=(80, 24)) as pilot:
        panel = a.main.query_one(DevicesPanel)
        await until_drawn(pilot, lambda: "chip|tpu3" in panel.row_keys)
        assert plain(panel, "chip|tpu3", "busy") == "87%"
        assert plain(panel, "chip|tpu3", "owner") == "1624 prog.py"  # narrow: still named
        assert "estimate" not in (panel.border_subtitle or "")
        assert "libtpu's duty cycle, read in pid 1624" in str(panel.tooltip)


async def test_without_a_host_scan_the_panel_is_as_before():
    a = WatchApp(FakeSource.demo(remote=False), 1.0, clock=FrozenClock(), tz=UTC, tick_s=None)
    async with a.run_test(size=(80, 24)) as pilot:
        panel = a.main.query_one(DevicesPanel)
        await until_drawn(pilot, lambda: panel.row_keys)
        assert not any(k.startswith("chip|") for k in panel.row_keys)
        assert "owner" not in [c[0] for c in panel._lt_columns]


def test_the_host_is_scanned_every_few_seconds_or_when_processes_change(tmp_path: Path):
    t = [0.0]
    scans: list[int] = []

    def scan_host() -> LocalScan:
        scans.append(1)
        return LocalScan()

    loop = DiscoveryLoop(tmp_path, probe_libtpu=False, scan_host=scan_host, clock=lambda: t[0])
    assert loop.scan().local is not None  # the first look scans
    for _ in range(4):  # discovery every 2 s (its default): no host scan within 5 s
        t[0] += 1.0
        assert loop.scan().local is None
    t[0] += 1.0
    assert loop.scan().local is not None and loop.host_scans == 2
    (tmp_path / "99.json").write_text("{}")  # a record (unreadable here): same processes
    t[0] += 1.0
    assert loop.scan().local is None


def test_the_watch_flag_all_reaches_the_dashboard(monkeypatch):
    from tpu_info.commands import cli

    seen: list[list[str]] = []
    monkeypatch.setattr(cli, "is_terminal", lambda: True)
    monkeypatch.setattr(os, "execv", lambda exe, argv: seen.append(list(argv)))
    assert cli.main(["--watch", "--all"]) == 0
    assert "--all" in seen[0]


SIZES = {"80x24": (80, 24), "160x45": (160, 45)}


@pytest.mark.parametrize("size", SIZES)
def test_sandbox_layout(snap_compare, tmp_path: Path, size: str):
    # tpu3 (JAX's TPU_0), its owner 1624 prog.py, 0.03/15.75 GiB, ~11%; three
    # chips counted in the Devices panel's subtitle.
    assert snap_compare(app(sandbox(tmp_path, HOLDS, WHO)[0]), terminal_size=SIZES[size])
