"""A poll costs in proportion to what changed: the exporter builds a
histogram only for a distribution record that is not the object of its last
poll and encodes again only the families that changed, and its exposition
stays byte for byte that of building and encoding everything anew.

Real parts: the hook's gRPC server (``metrics.export``) over a real
recorder in this process, found through a discovery record, asked with
cursors (:class:`tpu_info.wire.delta.Follower`); prometheus_client's encoders;
promtool.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import prometheus_client.exposition as pc_exposition
import pytest

from metrics import export
from metrics.recording.recorder import Recorder
from metrics.recording.snapshot import build
from tpu_info.commands.exporter import ExporterOptions, HostExporter, _encode
from tpu_info.contract.model import LocalScan, Unit
from tpu_info.outputs import prometheus
from tpu_info.outputs import prometheus_host as host_fams

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
FORMATS = ("", OPENMETRICS)


def _recorder(distributions: int = 6) -> tuple[Recorder, list[object]]:
    rng = random.Random(7)
    rec = Recorder()
    for i in range(30):
        rec.ledger.compiled(f"{i:064x}", f"jit(f{i})", "jax", seconds=rng.random(),
                            signature=("x: f32[8]",))
    dists = [rec.registry.distribution(f"Metric{d}", Unit.TIME_NS) for d in range(distributions)]
    for d in dists:
        for _ in range(50):
            d.observe(rng.lognormvariate(13, 1.0))
    return rec, dists


class _Counting:
    """Counts calls of a module function (histograms built, sample lines encoded)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
        self.calls = 0
        real = getattr(module, name)

        def counted(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    def since(self, mark: int) -> int:
        return self.calls - mark


def _promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_a_poll_rebuilds_and_encodes_only_what_changed_and_serves_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = _Counting(monkeypatch, prometheus, "cumulative_buckets")
    lines = _Counting(monkeypatch, pc_exposition, "floatToGoString")  # one per text sample
    rec, dists = _recorder()
    server = export.start(lambda since: build(rec, (), since), port=0, workers=2)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    (runtime / f"{os.getpid()}.json").write_text(json.dumps({
        "schema": 1, "pid": os.getpid(), "port": server.port, "host": "127.0.0.1",
        "argv": ["train.py"], "engine": "jax", "versions": {}, "start_time": time.time()}))
    ex = HostExporter(ExporterOptions(host_label="h1", job="j", runtime_dir=runtime,
                                      timeout_s=10.0, libtpu_target=None),
                      scan_chips=LocalScan)
    try:
        ex.poll()
        for accept in FORMATS:
            ex.body(accept, "")  # scrapers asked: the polls encode both formats from now on
        ex.poll()
        total_lines = ex.body("", "")[0].count(b"\n")
        for change in range(4):
            time.sleep(0.06)  # past the server's build cache
            mark_built, mark_lines = built.calls, lines.calls
            if change:  # one distribution changes; nothing else does (the first: none)
                dists[change].observe(5e12)  # 5000 s
            ex.poll()
            # Only the changed distribution's histogram was built again.
            assert built.since(mark_built) == (1 if change else 0)
            # Only what changed was encoded: far fewer lines than the exposition has
            # (a full encoding: every one of them, per format).
            assert lines.since(mark_lines) < total_lines / 4, (lines.since(mark_lines),
                                                               total_lines)
            for accept in FORMATS:
                served = ex.body(accept, "")[0]
                assert served == _encode(ex._families, accept, False)  # encoded anew, whole
            text = ex.body("", "")[0].decode()
            if change:  # the change is in this scrape: above every edge but +Inf
                name = f"tpu_info_metric{change}_seconds"
                assert (f'{name}_bucket{{host="h1",job="j",le="+Inf",'
                        f'program="train.py"}} 51.0') in text
                assert (f'{name}_bucket{{host="h1",job="j",le="1000.0",'
                        f'program="train.py"}} 50.0') in text
        _promtool_check(text)
        # The process goes: nothing of it is kept (bounded memory).
        (runtime / f"{os.getpid()}.json").unlink()
        ex.poll()
        assert not ex._states and not ex._followers
        for accept in FORMATS:
            held = ex._encodings[accept]._last
            assert held is not None and held[0]
            assert not any(s.labels.get("program") == "train.py"
                           for fam in held[0] for s in fam.samples)
    finally:
        ex.stop()
        server.stop(grace=0)


def test_families_with_reuse_equal_families_built_anew() -> None:
    """The same snapshot sequence, once with the reuse (records kept by the
    recorder: unchanged ones are the same objects) and once from deep copies
    (every record a new object, every family built and encoded anew):
    the same families and the same bytes, labels changing midway included."""
    rec, dists = _recorder(4)
    reused, fresh = prometheus.SeriesState(), prometheus.SeriesState()
    encodings = {accept: host_fams.PartsEncoding(accept) for accept in FORMATS}
    labels = {"host": "h1", "program": "train.py"}
    previous: dict[str, object] = {}
    for step in range(6):
        if step in (1, 2, 4):
            dists[step % 4].observe(1e6 * (step + 1))
        if step == 3:
            labels = {**labels, "rank": "0"}  # the rank, learned later
        if step == 5:
            rec.registry.distribution("Late", Unit.BYTES).observe(4096)  # a new record
        snap = build(rec, ())
        got = list(prometheus.families(snap, labels, state=reused))
        want = list(prometheus.families(copy.deepcopy(snap), labels, state=fresh))
        assert got == want
        for accept, enc in encodings.items():
            assert enc.encode(host_fams.groups(got)) == _encode(host_fams.merge(want), accept,
                                                                False)
        # An unchanged family is the very object of the last call; a changed one is new.
        now = {f.name: f for f in got}
        if step in (1, 2, 4):
            changed = f"tpu_info_metric{step % 4}_seconds"
            assert now[changed] is not previous[changed]
            assert now[changed] != previous[changed]
        if step == 2:
            assert now["tpu_info_metric3_seconds"] is previous["tpu_info_metric3_seconds"]
            assert now["tpu_info_uncached_compile"] is previous["tpu_info_uncached_compile"]
        if step == 3:  # new labels: every family carries them
            assert all(s.labels.get("rank") == "0" for f in got for s in f.samples)
        previous = now


def test_a_part_the_encoder_moves_has_its_group_encoded_whole() -> None:
    """The text format writes a counter's ``_created`` sample after its
    family; such a part is not pasted in place."""
    from prometheus_client.core import CounterMetricFamily

    a = CounterMetricFamily("x", "X.", labels=["pid"])
    a.add_metric(["1"], 1.0, created=100.0)
    b = CounterMetricFamily("x", "X.", labels=["pid"])
    b.add_metric(["2"], 2.0, created=200.0)
    for accept in FORMATS:
        got = host_fams.PartsEncoding(accept).encode(host_fams.groups([a, b]))
        assert got == _encode(host_fams.merge([a, b]), accept, False)
