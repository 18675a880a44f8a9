"""Google's 57 ``--metric`` names: each gives a value where a source has one,
else N/A with its reason, exit 0. Unit tests over records; end to end against
a real hooked JAX program and a real (fake) libtpu gRPC server."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rich.console import Console

from tests.conftest import ROOT
from tests.fixtures.google_names import (
    GOOGLE_LIST,
    ORBAX_RECORDS,
    ORBAX_SHOWN,
    FakeLibtpu,
    FakeLibtpuServer,
    sections,
)
from tpu_info.contract.model import CounterReading, Snapshot, Unit
from tpu_info.outputs.metric_tables import metric_table
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.views.google_metrics import GOOGLE_METRICS, LibtpuRead, Source
from tpu_info.views.metrics import metric_list, resolve, valid_names
from tpu_info.views.values import TargetView
from tpu_info.wire.libtpu_extra import DeviceGauge, cores_from_status, gauges_from_response


def _text(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return " ".join(console.export_text().replace("│", " ").split())  # wrapped cells: whole


def test_every_google_name_is_ours_too():
    assert sorted(GOOGLE_METRICS) == list(GOOGLE_LIST)
    assert set(GOOGLE_LIST) <= set(valid_names())
    assert {m["name"] for m in metric_list() if m["source"] == "google"} == set(GOOGLE_LIST)
    for name in GOOGLE_LIST:
        resolve(name)  # no "unknown metric"
    assert resolve("hlo_exec_timing") == "ExecuteTime"
    assert resolve("hbm usage") == "hbm_usage"  # Google's spelling with a space


def test_gauges_read_both_device_spellings_and_drop_non_finite():
    resp = lpb.MetricResponse()
    for dev, v in ((1, 2.0), (0, float("nan"))):
        m = resp.metric.metrics.add()
        m.attribute.value.int_attr = dev
        m.gauge.as_double = v
    for dev, kind, value in ((2, "string_attr", "2"), (3, "int_attr", 3)):  # HLO gauges' kvlist
        m = resp.metric.metrics.add()
        kv = m.attribute.value.kvlist_attr.attributes.add()
        kv.key = "device_ordinal"
        setattr(kv.value, kind, value)
        m.gauge.as_int = 7 if dev == 2 else 4
    assert gauges_from_response(resp) == (DeviceGauge(1, 2.0), DeviceGauge(2, 7.0),
                                          DeviceGauge(3, 4.0))


def test_core_states_from_runtime_status():
    class Ctx:
        pass

    resp = FakeLibtpu().GetTpuRuntimeStatus(lpb.GetTpuRuntimeStatusRequest(
        include_hlo_info=True), Ctx())
    cores = cores_from_status(resp)
    assert [(c.global_core_id, c.core_type, c.xdb_server) for c in cores] == [
        (0, "TPU_CORE_TYPE_TENSOR_CORE", False), (1, "TPU_CORE_TYPE_TENSOR_CORE", False)]
    s, q = cores[1].sequencers[0], cores[1].queued[0]
    assert (s.pc, s.program_id, s.hlo_location, q.fingerprint) == (4097, 42, "fusion.3", "abcd")


def test_reasons_by_source_without_any_source():
    hook = TargetView("127.0.0.1:1", Snapshot(taken_at_unix=0.0))
    for name, m in GOOGLE_METRICS.items():
        text = _text(metric_table(name, [hook]))
        if m.source in (Source.DEVICE_HBM, Source.DEVICE_BUSY):
            assert "N/A: the process reported no devices" in text, text
        elif m.source is Source.OURS:
            assert "N/A" in text and f"no {m.key} samples recorded" in text, text
        elif m.source in (Source.LIBTPU_GAUGE, Source.LIBTPU_LATENCY, Source.LIBTPU_STATUS):
            assert "libtpu's service is not reachable on this host" in text, text
        elif m.source is Source.JAX_MONITORING:
            assert f"no hooked process has recorded {m.key}" in text, text
        else:
            assert "the hook does not record it" in text, text


def test_libtpu_answers_become_tables():
    libtpu = TargetView("localhost:8431", Snapshot(taken_at_unix=0.0), source="libtpu")
    reads = {"runtime_hbm_utilization": (LibtpuRead("localhost:8431",
                                                    gauges=(DeviceGauge(0, 37.5),)),),
             "grpc_tcp_min_rtt": (LibtpuRead("localhost:8431", served=False),),
             "core_state": (LibtpuRead("localhost:8431", error="no answer within 2s"),)}
    assert "0 37.5%" in _text(metric_table("runtime_hbm_utilization", [libtpu], libtpu=reads))
    assert "needs libtpu's gRPC TCP metrics" in _text(
        metric_table("grpc_tcp_min_rtt", [libtpu], libtpu=reads))
    assert "libtpu did not answer: no answer within 2s" in _text(
        metric_table("core_state", [libtpu], libtpu=reads))
    assert "megascale metrics exist only in multi-slice jobs" in _text(
        metric_table("collective_e2e_latency", [libtpu], libtpu=reads))


def test_orbax_from_a_hooks_jax_monitoring_record():
    snap = Snapshot(taken_at_unix=0.0, counters=(
        CounterReading("/jax/orbax/write/start", 3, Unit.NUMBER),))
    text = _text(metric_table("orbax_write_start_count", [TargetView("h:1", snap)]))
    assert "orbax_write_start_count" in text and " 3 " in f"{text} ", text


@pytest.mark.slow
def test_all_57_names_against_a_hooked_program_and_libtpu(tmp_path):
    """One ``tpu-info`` with every name, reading a hooked JAX program (which
    records orbax's jax.monitoring names) and a libtpu gRPC server."""
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"), COLUMNS="200", JAX_PLATFORMS="cpu")
    program = ("import sys, jax, jax.numpy as jnp, metrics\nmetrics.install()\n"
               "jax.jit(lambda x: x * 2)(jnp.ones(4)).block_until_ready()\n"
               + ORBAX_RECORDS + "print('ready', flush=True)\nsys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        args = [a for n in GOOGLE_LIST for a in ("--metric", n)]
        with FakeLibtpuServer() as libtpu:
            r = subprocess.run([sys.executable, "-m", "tpu_info", "--timeout", "30",
                                "--target", libtpu.target, *args], capture_output=True,
                               text=True, env=env, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr
        got = sections(r.stdout, GOOGLE_LIST)
        assert set(got) == set(GOOGLE_LIST), set(GOOGLE_LIST) - set(got)
        assert "37.5%" in got["runtime_hbm_utilization"]
        assert "0.5 s" in got["tensorcore_idle_duration"]
        assert "buffer-size=1MB+" in got["buffer_transfer_latency"]
        assert "TPU_CORE_TYPE_TENSOR_CORE" in got["core_state"]
        assert "4097" in got["sequencer_state"] and "fusion.3" in got["sequencer_state_detailed"]
        assert "abcd" in got["queued_programs"]
        assert "needs libtpu's gRPC TCP metrics" in got["grpc_tcp_delivery_rate"]
        assert "80.0%" in got["duty_cycle_percent"] and "2.00 GiB" in got["hbm_usage"]
        for name, value in ORBAX_SHOWN.items():
            assert value in got[name] and "N/A" not in got[name], got[name]
        assert "no hooked process has recorded" in got["orbax_read_start_count"]
        assert "Prometheus endpoint" in got["pygrain_dataset_next_duration"]
        for name, text in got.items():  # a value or a reason, never a bare N/A
            assert "N/A" not in text.replace("N/A:", "") or "N/A:" in text, (name, text)
        # Without libtpu: the names only it serves say so, still exit 0.
        r = subprocess.run([sys.executable, "-m", "tpu_info", "--timeout", "30", *args],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr
        got = sections(r.stdout, GOOGLE_LIST)
        assert set(got) == set(GOOGLE_LIST)
        for name in ("core_state", "hlo_queue_size", "grpc_tcp_min_rtt"):
            assert "libtpu's service is not reachable on this host" in got[name], got[name]
        assert "2" in got["orbax_write_start_count"]
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
