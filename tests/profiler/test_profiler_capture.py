"""Captures inside a real JAX program: content, limits, one at a time, device traces."""

from __future__ import annotations

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import metrics
import profiler
from profiler.capture import Capture
from tests.profiler.test_profiler_format import validate_trace


def _loop(steps: int = 4) -> None:
    @jax.jit
    def train_step(x):
        return (x * 2).sum()

    for i, n in enumerate([8] * (steps // 2) + [16] * (steps - steps // 2)):
        with profiler.StepTrace("train_step", step_num=i):
            with profiler.Trace("forward"):
                train_step(jnp.ones(n)).block_until_ready()
            host = jax.device_get(jax.device_put(np.arange(256.0)))  # host data moves
            assert host.shape == (256,)
        time.sleep(0.01)


def test_trace_of_a_jax_loop_has_steps_compiles_and_transfers(fresh_metrics, tmp_path) -> None:
    path = tmp_path / "trace.json"
    session = profiler.trace(60, path, sample_interval_s=0.01)
    _loop()
    session.stop()
    result = session.wait(timeout=30)
    assert result.path == path and not result.truncated
    doc = json.loads(path.read_bytes())
    events = validate_trace(doc)
    x = [e for e in events if e["ph"] == "X"]
    user = [e for e in x if e["cat"] == "user"]
    assert [e["args"]["step_num"] for e in user if e["name"] == "train_step"] == [0, 1, 2, 3]
    assert sum(e["name"] == "forward" for e in user) == 4
    steps = [e for e in x if e["cat"] == "step"]
    assert [e["name"] for e in steps] == ["step 2", "step 3", "step 4"]
    compiles = [e for e in x if e["cat"] == "compile"]
    f = [c for c in compiles if "train_step" in c["name"]]
    assert [c["args"]["kind"] for c in f] == ["compile", "recompile"]
    assert all(len(c["args"]["graph_hash"]) == 64 for c in f)
    assert f[0]["args"]["cause"] == "first compile"
    assert "f32[8]" in f[1]["args"]["cause"] and "f32[16]" in f[1]["args"]["cause"]
    assert f[0]["dur"] == pytest.approx(f[0]["args"]["compile_seconds"] * 1e6, abs=0.01)
    transfers = [e for e in events if e["ph"] == "i" and e["cat"] == "transfer"]
    assert sum(e["name"] == "from device" for e in transfers) == 4
    assert sum(e["name"] == "to device" for e in transfers) == 4
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"compiles", "transfer bytes", "HBM in use (bytes)"} <= counters
    last_moved = [e for e in events if e["name"] == "transfer bytes"][-1]["args"]
    assert last_moved["from_device"] == 4 * 256 * 4
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"MainThread", "steps (metrics.mark_step)", "compiles", "transfers"} <= tracks
    assert any(e["name"] == "process_name" for e in events)


def test_core_api_mark_step_alone_gives_steps(fresh_metrics) -> None:
    cap = Capture(30, sample_interval_s=0.01)
    stop = threading.Event()
    out: list = []
    t = threading.Thread(target=lambda: out.append(cap.run(stop)))
    t.start()
    for _ in range(4):
        time.sleep(0.01)
        metrics.mark_step()
    stop.set()
    t.join(30)
    events = validate_trace(json.loads(out[0].trace))
    assert [e["name"] for e in events if e.get("cat") == "step"] == ["step 2", "step 3", "step 4"]


def test_a_second_capture_is_refused_while_one_runs(tmp_path) -> None:
    session = profiler.trace(30, tmp_path / "a.json")
    try:
        with pytest.raises(profiler.CaptureBusy, match="already running"):
            profiler.trace(1, tmp_path / "b.json")
    finally:
        session.stop()
        session.wait(30)
    profiler.trace(0.01, tmp_path / "c.json").wait(30)  # free again


@pytest.mark.parametrize("kw", [dict(duration_s=0), dict(duration_s=301),
                                dict(duration_s=float("nan")), dict(duration_s=1, max_bytes=10),
                                dict(duration_s=1, max_annotations=0)])
def test_limits_are_checked(kw) -> None:
    with pytest.raises(profiler.InvalidCapture):
        Capture(**kw)
    Capture(1).release()  # a refused capture holds no slot


def test_duration_ends_the_capture(tmp_path) -> None:
    started = time.monotonic()
    result = profiler.trace(0.2, tmp_path / "t.json", sample_interval_s=0.05).wait(30)
    assert 0.2 <= time.monotonic() - started < 10
    assert json.loads(result.trace)["otherData"]["duration_s"] >= 0.2


def test_size_limits_hold_and_are_noted(tmp_path) -> None:
    session = profiler.trace(30, tmp_path / "t.json", max_annotations=100, max_bytes=8192)
    for i in range(1000):
        with profiler.Trace(f"span {i}"):
            pass
    session.stop()
    result = session.wait(30)
    data = (tmp_path / "t.json").read_bytes()
    assert len(data) <= 8192 and result.truncated
    doc = json.loads(data)
    validate_trace(doc)
    assert doc["otherData"]["truncated"] is True
    assert any("max_annotations" in n for n in doc["otherData"]["notes"])
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) <= 50


def test_device_trace_with_jax_profiler(fresh_metrics, tmp_path) -> None:
    session = profiler.trace(30, tmp_path / "run.json", device=True, sample_interval_s=0.05)
    _loop(2)
    session.stop()
    result = session.wait(60)
    assert result.device_files, result.notes
    # torch.profiler writes beside it when torch is loaded (as in the full suite).
    assert all(p.is_relative_to(tmp_path / "run_device") for p in result.device_files)
    jax_files = [p for p in result.device_files if p.is_relative_to(tmp_path / "run_device" / "jax")]
    assert any(p.name.endswith(".xplane.pb") for p in jax_files)
    other = json.loads(result.trace)["otherData"]
    assert other["device_dir"] == str(tmp_path / "run_device")
    assert all(not name.startswith("/") for name in other["device_traces"])
