"""Every ``jax.monitoring`` record of any library (checkpointing, data loading)
is kept under its own name, bounded by a cap on distinct names with an
overflow counter, and shows in the snapshot, ``metrics_report()``, Prometheus
and across the wire in ``tpu-info --metric NAME``, ``--json`` and ``report``
(with the program's own unit-carrying metrics). Real JAX, gRPC and CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metrics.engines.jax.monitoring import MonitoringRecords
from metrics.recording.recorder import Recorder
from tests.conftest import ROOT
from tpu_info.contract.model import Unit


def test_monitoring_names_are_bounded_with_an_overflow_counter():
    rec = Recorder()
    m = MonitoringRecords(rec, max_names=3)
    for i in range(5):
        m.duration(f"/lib/op{i}", 0.001)
    m.event("/lib/op0")  # a fourth name: dropped too
    m.duration("/lib/op1", 0.002)  # a kept name still records
    assert rec.registry.metric_names() == ["/lib/op0", "/lib/op1", "/lib/op2"]
    assert rec.registry.metric_data("/lib/op1")[:2] == (2, 3_000_000.0)
    assert rec.registry.counter_value("JaxMonitoringDropped") == 3


def test_a_name_used_for_a_duration_and_a_scalar_keeps_both_units():
    rec = Recorder()
    m = MonitoringRecords(rec)
    m.duration("/lib/load", 0.5)
    m.scalar("/lib/load", 7)
    m.scalar("/jax/core/compile/backend_compile_duration", 1.7e9)  # JAX's start time: skipped
    assert sorted(rec.registry.metric_names()) == ["/lib/load", "/lib/load:scalar"]
    assert rec.registry.distribution("/lib/load:scalar").unit is Unit.NUMBER


PROGRAM = r"""
import sys
import metrics
metrics.install()
import jax, jax.numpy as jnp
jax.monitoring.record_event_duration_secs('/myapp/checkpoint/save', 0.2)
jax.monitoring.record_event('/myapp/data/epoch')
jax.monitoring.record_scalar('/myapp/data/queue_depth', 7)
metrics.distribution("DataLoadTime", unit="ns", help="Time to load one batch.").observe(1.5e6)
jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
print(metrics.exporter().address, flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_jax_monitoring_and_custom_metrics_over_the_wire(tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               TPU_INFO_PORT="0", JAX_PLATFORMS="cpu", COLUMNS="160")
    p = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=ROOT)
    try:
        address = p.stdout.readline().strip()
        assert address, p.stderr.read()[-3000:]

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "tpu_info", "--no-discovery",
                                   "--target", address, *args], capture_output=True, text=True,
                                  timeout=60, env=env, cwd=ROOT)

        r = cli("--metric", "/myapp/checkpoint/save", "--metric", "DataLoadTime")
        assert r.returncode == 0, r.stderr
        assert "/myapp/checkpoint/save" in r.stdout and "jax.monitoring duration" in r.stdout
        assert "200" in r.stdout and "ms" in r.stdout, r.stdout  # p50 of 0.2 s, as a time
        assert "Time to load one batch. (unit: ns)" in r.stdout, r.stdout
        bad = cli("--metric", "/myapp/nothing")
        assert bad.returncode == 2 and "no target read records it" in bad.stderr
        doc = json.loads(cli("--json").stdout)
        by_name = {m["name"]: m for m in doc["targets"][0]["custom_metrics"]}
        save = by_name["/myapp/checkpoint/save"]
        assert save["kind"] == "distribution" and save["unit"] == "ns"
        assert save["count"] == 1 and save["total"] == pytest.approx(2e8)
        assert by_name["/myapp/data/epoch"]["value"] == 1
        assert by_name["/myapp/data/queue_depth"]["unit"] == "1"
        assert by_name["DataLoadTime"]["help"] == "Time to load one batch."
        report = subprocess.run([sys.executable, "-m", "tpu_info", "report", "--target",
                                 address], capture_output=True, text=True, timeout=60,
                                env=env, cwd=ROOT)
        assert "Metric: /myapp/checkpoint/save\n  TotalSamples: 1\n  Accumulator: " \
            "200ms000.000us" in report.stdout, report.stdout[:2000]
    finally:
        p.stdin.close()
        p.wait(timeout=30)
