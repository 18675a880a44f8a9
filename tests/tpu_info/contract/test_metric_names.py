"""Names from a process never make an exposition promtool refuses (issue 29, item 6).

Both ends: the hook refuses a name that breaks the rule (``ValueError`` saying
it); the expositions (the hook's own ``/metrics``, ``tpu-info exporter``) map
or leave out, counted in ``tpu_info_names_dropped{reason}``, whatever an older
or hostile hook sends. Real parts: the hook's recorder, its gRPC server and
its Prometheus endpoint over real HTTP, a hostile gRPC server
(:mod:`tests.hostile_server`), the host exporter, and the real ``promtool``.
Before the fix a counter named with quotes, a newline and ``}`` became
``tpu_info_a_b_c_evil_..._total`` and promtool exited 3.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from metrics import export
from metrics.export import prometheus as hook_prometheus
from metrics.recording import custom
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
from tests.hostile_server import HostileServer
from tpu_info.commands.exporter import ExporterOptions, HostExporter
from tpu_info.contract import names
from tpu_info.contract.model import LocalScan, Unit

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
EVIL = 'a"b\nc}evil{x="1"'
# What an older hook recorded as given, and why each is left out.
HOSTILE = {EVIL: "unit_abbreviation", "LoadMs": "unit_abbreviation",
           "latency_milliseconds": "prefixed_unit", "RequestCounter": "type_in_name",
           "Events": "reserved", "ok": "duplicate"}


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("name", [EVIL, "", "9lives", "__x", "é", "a b", "LoadMs", "x" * 201,
                                  "batch_sec", "latency_milliseconds", "RequestCounter",
                                  "SizeKb"])
def test_the_hook_refuses_a_name_that_breaks_the_rule(name: str) -> None:
    with pytest.raises(ValueError) as e:
        custom.define(Recorder(), "counter", name, "1", "")
    assert names.NAME_RULE in str(e.value)


def test_a_distribution_total_and_good_names() -> None:
    rec = Recorder()
    with pytest.raises(ValueError, match="only a counter"):
        custom.define(rec, "distribution", "BatchTotal", "1", "")
    custom.define(rec, "counter", "BatchTotal", "1", "")
    for good in ("DataLoadTime", "data_load_time", "Checkpoints", "TPUMemory", "Step2Loss"):
        custom.define(rec, "distribution", good, "ns", "")


def _hostile_recorder() -> Recorder:
    """A recorder holding what an older hook let a program record."""
    rec = Recorder()
    custom.define(rec, "counter", "Ok", "1", "A fine one.").inc(2)
    for name in HOSTILE:
        rec.registry.counter(name, Unit.NUMBER, "help \x1b]0;title\x07 " + name).inc()
    rec.registry.counter("", Unit.NUMBER).inc()  # tpu_info___total before
    rec.registry.distribution("WaitTotal", Unit.NUMBER).observe(3)
    return rec


def _dropped(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tpu_info_names_dropped{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0) + float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.slow
def test_the_hooks_own_endpoint_leaves_out_and_counts_hostile_names() -> None:
    rec = _hostile_recorder()
    server = hook_prometheus.start_http(lambda: build(rec, (), 0), port=0)
    try:
        for accept in ("", OPENMETRICS):
            req = urllib.request.Request(server.url, headers={"Accept": accept})
            text = urllib.request.urlopen(req, timeout=10).read().decode()
            assert "evil" not in text and "tpu_info___total" not in text
            assert "tpu_info_ok_total" in text and "\x1b" not in text
            assert _dropped(text) == {"unit_abbreviation": 2, "prefixed_unit": 1,
                                      "type_in_name": 1, "reserved": 1, "duplicate": 1,
                                      "invalid": 1, "total_suffix": 1}
            if not accept:
                promtool_check(text)
    finally:
        server.stop()


def _record(runtime: Path, name: str, port: int) -> None:
    (runtime / f"{name}.json").write_text(json.dumps({
        "schema": 1, "pid": os.getpid(), "port": port, "host": "127.0.0.1",
        "argv": ["train.py"], "engine": "jax", "versions": {"": "1", "Jax": "0.10"},
        "start_time": psutil.Process().create_time()}))


@pytest.mark.slow
def test_the_exporter_over_hostile_processes_passes_promtool(tmp_path: Path) -> None:
    rec = _hostile_recorder()
    hook = export.start(lambda since: build(rec, (), since), port=0, workers=2)
    hostile = HostileServer("escape")  # escapes in every string, counter names included
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    _record(runtime, str(os.getpid()), hook.port)
    ex = HostExporter(ExporterOptions(host_label="h1", runtime_dir=runtime, timeout_s=10.0,
                                      libtpu_target=None), scan_chips=LocalScan)
    try:
        ex.poll()
        text = ex.body("", "")[0].decode()
        assert 'tpu_info_target_up{' in text and "tpu_info_ok_total" in text
        assert _dropped(text)["unit_abbreviation"] == 2
        promtool_check(text)
        # The hostile server's record replaces the hook's (same pid: one record).
        _record(runtime, str(os.getpid()), hostile.port)
        time.sleep(0.01)
        ex._rescanner.settle_s = 1e9  # read the directory again now
        ex.poll()
        text = ex.body("", "")[0].decode()
        assert 'tpu_info_target_up{' in text and " 1.0" in text
        assert "\x1b" not in text
        promtool_check(text)
        assert "\x1b" not in ex.body(OPENMETRICS, "")[0].decode()
    finally:
        ex.stop()
        hostile.stop()
        hook.stop(grace=0)
