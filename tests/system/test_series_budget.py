"""A fleet's series budget and identity (issue 30, items 3 and 4), on real
hooked JAX programs: the hook's own ``/metrics`` and ``tpu-info exporter``.

Before: an idle JAX process exposed 776 series (700 of them buckets of 13
histograms, empty ones and torch's ``eager_fallback_time_seconds`` among
them) and the exporter put ``pid`` on every one, so a restart made a second
set (761 -> 1,522 series); two independent runs of one script both said
``process_index="0"`` and were summed as one line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tpu_info.commands.exporter import ExporterOptions, HostExporter
from tpu_info.contract.model import LocalScan

pytestmark = pytest.mark.slow

IDLE_BUDGET = 200  # series of an idle JAX process (4 CPU devices)
# after 100 steps: 8 histograms of 24-28 series each (DispatchWaitTime, the
# host's slack, joined them: 293 read), and the rest
STEPPED_BUDGET = 310

TRAIN = textwrap.dedent("""
    import json, os, sys
    import jax, jax.numpy as jnp
    import metrics
    metrics.install()
    f = jax.jit(lambda x: x * 2 + 1)
    x = f(jnp.ones(8)).block_until_ready()
    print(json.dumps({"pid": os.getpid()}), flush=True)
    for line in sys.stdin:  # a number of steps, then say so
        for _ in range(int(line)):
            x = f(x)
            float(x.sum())
            metrics.mark_step()
        print("stepped", flush=True)
""")

Series = frozenset[tuple[str, frozenset[tuple[str, str]]]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _series(text: str) -> Series:
    return frozenset((s.name, frozenset(s.labels.items()))
                     for fam in text_string_to_metric_families(text) for s in fam.samples)


class Program:
    """``train.py`` (:data:`TRAIN`) hooked, idle once its first jit compiled."""

    def __init__(self, script: Path, runtime: Path, prometheus_port: int | None = None,
                 **env: str) -> None:
        full = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(runtime), PYTHONPATH=str(ROOT), **env)
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            if name not in env:
                full.pop(name, None)  # independent programs: no launcher says a rank
        if prometheus_port is not None:
            full["TPU_INFO_PROMETHEUS_PORT"] = str(prometheus_port)
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=full, cwd=ROOT)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert line, f"train.py did not start (exit {self.proc.poll()})"
        self.pid = json.loads(line)["pid"]

    def step(self, n: int) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "stepped"

    def stop(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(60)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


def test_an_idle_jax_process_stays_within_its_series_budget(script: Path, runtime: Path):
    port = _free_port()
    program = Program(script, runtime, prometheus_port=port)
    try:
        def scrape() -> tuple[Series, dict[str, str]]:
            time.sleep(1.1)  # past the endpoint's one-second body cache
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
            types = {f.name: f.type for f in text_string_to_metric_families(text)}
            return _series(text), types

        idle, types = scrape()
        histograms = {name for name, kind in types.items() if kind == "histogram"}
        assert len(idle) <= IDLE_BUDGET, (len(idle), sorted(histograms))
        # A histogram comes with its first sample: the compile's and the first
        # call's, not the steps' yet; JAX's jax.monitoring copies are left out.
        assert histograms == {"tpu_info_compile_time_seconds", "tpu_info_trace_time_seconds",
                              "tpu_info_lowering_time_seconds",
                              "tpu_info_execute_time_seconds"}, histograms
        # torch.compile's families are not a JAX process's, even at zero.
        assert not {"tpu_info_eager_fallback_time_seconds",
                    "tpu_info_graph_breaks"} & set(types)
        assert "tpu_info_uncached_compile" in types  # counters stay, at zero until they count

        program.step(100)
        stepped, types = scrape()
        histograms = {name for name, kind in types.items() if kind == "histogram"}
        assert len(stepped) <= STEPPED_BUDGET, (len(stepped), sorted(histograms))
        assert {"tpu_info_step_time_seconds", "tpu_info_execute_time_seconds"} <= histograms
        assert ("tpu_info_step_time_seconds_count", frozenset()) in stepped
        assert "tpu_info_eager_fallback_time_seconds" not in types
    finally:
        program.stop()


def _exporter_series(ex: HostExporter) -> Series:
    ex.poll()
    return frozenset(s for s in _series(ex.body("", "")[0].decode())
                     if dict(s[1]).get("program", "").startswith("train.py"))


def _without_pid(series: Series) -> Series:
    return frozenset((name, frozenset(kv for kv in labels if kv[0] != "pid"))
                     for name, labels in series)


def _without_findings(series: Series) -> Series:
    return frozenset(s for s in series if not s[0].startswith("tpu_info_finding"))


def test_a_restart_keeps_every_series_and_two_runs_of_one_script_stay_apart(
        script: Path, runtime: Path):
    ex = HostExporter(ExporterOptions(host_label="h1", job="llama", runtime_dir=runtime,
                                      timeout_s=10.0, libtpu_target=None), scan_chips=LocalScan)
    first = Program(script, runtime)
    second = Program(script, runtime)  # the same script, another independent run
    restarted = None
    try:
        before = _exporter_series(ex)
        infos = {dict(labels)["program"]: dict(labels)["pid"]
                 for name, labels in before if name == "tpu_info_process_info"}
        # Told apart with neither in a job: no rank label, the second run's program is #2.
        assert infos == {"train.py": str(first.pid), "train.py#2": str(second.pid)}, infos
        assert not any("rank" in dict(labels) and dict(labels)["rank"]
                       for _, labels in before)
        # The pid is on the info series alone.
        assert [s for s in before if "pid" in dict(s[1])
                and s[0] != "tpu_info_process_info"] == []

        first.stop()
        restarted = Program(script, runtime)
        after = _exporter_series(ex)
        infos = {dict(labels)["program"]: dict(labels)["pid"]
                 for name, labels in after if name == "tpu_info_process_info"}
        assert infos == {"train.py": str(restarted.pid), "train.py#2": str(second.pid)}
        # Every series of the restarted process is the one it had: only the
        # info series changed (its pid). Findings come and go with time (on a
        # loaded machine compile_share appeared between the two reads), so
        # their families are left out.
        before, after = _without_findings(before), _without_findings(after)
        assert before ^ after == {s for s in before ^ after if s[0] == "tpu_info_process_info"}
        assert len(before ^ after) == 2
        assert _without_pid(before) == _without_pid(after)
    finally:
        ex.stop()
        for p in (first, second, restarted):
            if p is not None:
                p.stop()


def test_ranks_of_a_job_are_labelled_and_a_lone_program_has_none(script: Path, runtime: Path):
    ex = HostExporter(ExporterOptions(host_label="h1", runtime_dir=runtime, timeout_s=10.0,
                                      libtpu_target=None), scan_chips=LocalScan)
    lone = Program(script, runtime)
    ranked = Program(script, runtime, RANK="1", WORLD_SIZE="2")
    try:
        series = _exporter_series(ex)
        ups = {frozenset((k, v) for k, v in labels if v)
               for name, labels in series if name == "tpu_info_target_up"}
        # The lone one is train.py; the rank of a job is (train.py, rank 1): no #2
        # needed, the rank tells them apart.
        assert ups == {frozenset({("host", "h1"), ("program", "train.py")}),
                       frozenset({("host", "h1"), ("program", "train.py"), ("rank", "1")})}
    finally:
        ex.stop()
        lone.stop()
        ranked.stop()
