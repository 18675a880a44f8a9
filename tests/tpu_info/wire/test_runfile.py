"""Saved runs on disk: the wire's protobuf behind a magic, read back as a live
answer would be, and refused with one line when the file is not one."""

from __future__ import annotations

import os
import threading

import pytest

from tpu_info.contract.model import Event, GraphRecord, ProcessRecord, Snapshot, StepsReading
from tpu_info.wire import runfile
from tpu_info.wire.encoder import snapshot_to_bytes

SNAP = Snapshot(
    1000.0, ProcessRecord(7, "train.py", engine="jax"), uptime_seconds=30.0,
    graphs=(GraphRecord("a" * 64, "jit(step)", "jax", 990.0, 999.0, compiles=2,
                        compile_seconds_total=1.5, compile_seconds_last=0.5),),
    events=(Event(1, 995.0, "compile", "jit(step)", "a" * 64, "", "/w/train.py:3", 0.5),),
    last_seq=1, steps=StepsReading(100, "marked", "metrics.mark_step", 20.0))


def _saved(tmp_path, **kw) -> str:
    path = str(tmp_path / "r.tpurun")
    runfile.write(path, runfile.encode(snapshot_to_bytes(SNAP), kw.pop("ended", "exit"),
                                       1001.0, **kw))
    return path


def test_a_saved_run_reads_back_as_the_snapshot_it_was(tmp_path):
    run = runfile.read(_saved(tmp_path))
    assert run.snapshot.process.name == "train.py" and run.snapshot.steps.count == 100
    assert run.snapshot.graphs[0].compiles == 2 and run.snapshot.events[0].location.endswith(":3")
    assert run.ended == "exit" and run.ended_unix == 1001.0 and run.how_it_ended() == "exit"
    sig = runfile.read(_saved(tmp_path, ended="signal", signal="SIGTERM"))
    assert sig.how_it_ended() == "SIGTERM"
    exc = runfile.read(_saved(tmp_path, ended="exception", error="ValueError: bad"))
    assert exc.how_it_ended() == "exception: ValueError: bad"


@pytest.mark.parametrize("damage", ["truncated", "not_ours", "newer", "empty", "garbage"])
def test_a_file_that_is_not_a_whole_saved_run_is_refused_in_one_line(tmp_path, damage):
    path = _saved(tmp_path)
    data = open(path, "rb").read()
    bad = {"truncated": data[: len(data) - 40], "not_ours": b"{\"json\": 1}\n",
           "newer": runfile.MAGIC + b"\x08\x63", "empty": b"",
           "garbage": runfile.MAGIC + os.urandom(4000)}[damage]
    with open(path, "wb") as f:
        f.write(bad)
    with pytest.raises(runfile.RunFileError) as e:
        runfile.read(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(path)
    if damage == "newer":
        assert "upgrade tpu-info" in message


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    out: list[BaseException] = []
    t = threading.Thread(target=lambda: out.append(pytest.raises(
        runfile.RunFileError, runfile.read, fifo).value), daemon=True)
    t.start()
    t.join(5.0)
    assert not t.is_alive() and "not a regular file" in str(out[0])


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path):
    path = _saved(tmp_path)
    before = open(path, "rb").read()

    with pytest.raises(TypeError):
        runfile.write(path, object())  # type: ignore[arg-type]  # fails inside the write
    assert open(path, "rb").read() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.tpurun"]
