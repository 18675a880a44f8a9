"""A program without steps (pytorch/examples' mnist_hogwild parent: it
spawns the trainers and runs one test itself): its reads are said from a
hundred and a share of the run, not from 1 ms of it (157 ``.item()`` reads,
1.2 ms of a 42 s run, read "Log every N steps" at warning)."""

from __future__ import annotations

from tpu_info.contract.model import ProcessRecord, SiteReading, Snapshot
from tpu_info.views.findings import find


def _snap(seconds: float) -> Snapshot:
    read = SiteReading("sync", "/w/train.py:49", 157, bytes=628, seconds=seconds,
                       detail=".item()", function="test_epoch", drain_seconds=seconds)
    return Snapshot(taken_at_unix=100.0, uptime_seconds=42.0,
                    process=ProcessRecord(pid=1, name="main.py", engine="torch"), sites=(read,))


def test_a_few_milliseconds_of_reads_in_a_long_run_are_no_finding():
    assert not [f for f in find(_snap(0.0012)) if f.location == "/w/train.py:49"]


def test_reads_that_weigh_on_the_run_are_said():
    assert [f for f in find(_snap(2.0)) if f.location == "/w/train.py:49"]
