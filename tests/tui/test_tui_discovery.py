"""The dashboard's discovery loop: stale records removed once, rescans cheap
while nothing changes, and libtpu's port judged as `tpu-info` judges it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.tpu_info.host.test_libtpu_port import LIBTPU_MAP, OTHER, fake_proc
from tui.source import DiscoveryLoop


def _records(rt: Path, count: int) -> None:
    rt.mkdir(mode=0o700)
    for n in range(count):
        pid = 4_200_000 + n  # above any pid_max: dead
        (rt / f"{pid}.json").write_text(json.dumps({
            "schema": 1, "pid": pid, "port": 1, "host": "127.0.0.1", "argv": ["t.py"],
            "engine": "jax", "versions": {}, "start_time": 1.0}))
    (rt / f"{os.getpid()}.json").write_text(json.dumps({
        "schema": 1, "pid": os.getpid(), "port": 2, "host": "127.0.0.1", "argv": ["me.py"],
        "engine": "jax", "versions": {}, "start_time": time.time()}))


def test_stale_records_are_removed_and_rescans_read_nothing(tmp_path: Path):
    rt = tmp_path / "rt"
    _records(rt, 2000)
    loop = DiscoveryLoop(rt, probe_libtpu=False, proc_root=fake_proc(tmp_path / "proc", []))
    loop.rescanner.clock = lambda: time.time() + 60  # every change has settled
    assert loop.scan().processes == (("127.0.0.1:2", ("me.py",)),)
    assert sorted(p.name for p in rt.iterdir()) == [f"{os.getpid()}.json"]
    for _ in range(3):
        assert loop.scan().processes == (("127.0.0.1:2", ("me.py",)),)
        assert loop.rescanner.scan().files_read == 0


def test_libtpu_port_is_judged(tmp_path: Path):
    me = os.geteuid()
    for uid, shown in ((OTHER, False), (me, True)):
        proc = fake_proc(tmp_path / f"proc-{uid}", [(8431, uid, 7)],
                         {321: {"inodes": [7], "maps": LIBTPU_MAP}})
        loop = DiscoveryLoop(tmp_path / "none", proc_root=proc)
        assert (("localhost:8431", ()) in loop.scan().processes) is shown
