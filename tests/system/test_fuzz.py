"""Hostile input never gets past the edges as a traceback: bytes and absurd
values from the wire give typed errors or render cleanly; random command
lines give exit code 0, 1 or 2."""

from __future__ import annotations

import json

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from tests.hostile_server import forbidden_in
from tpu_info.commands import cli
from tpu_info.contract.errors import TpuInfoError
from tpu_info.outputs.jsonview import dumps, to_json
from tpu_info.outputs.render import render_text
from tpu_info.outputs.textreport import metrics_report
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.views.values import TargetView
from tpu_info.wire import codec as wire
from tui.source import Conn, Update
from tui.state import TargetData, series
from tui.widgets.common import hms, sparkline

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _render_everything(msg: pb.Snapshot) -> None:
    try:
        snap = wire.snapshot_from_proto(msg)
    except TpuInfoError:
        return
    views = [TargetView("fuzz:1", snap)]
    for width in (80, 160):
        text = render_text(views, width=width)
        assert all(cell_len(line) <= width for line in text.splitlines())
        assert not forbidden_in(text)
    json.loads(dumps(to_json(views)), parse_constant=_not_json)  # strict JSON
    assert not forbidden_in(metrics_report(snap))
    d = TargetData("fuzz:1")  # the dashboard's fold and its charts
    for _ in range(2):
        d.apply(Update("fuzz:1", Conn.STREAMING, snap))
    for attr in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
        sparkline(series(d.samples, attr), 10)
    for dev in snap.devices:
        sparkline(series(d.samples, "busy", dev.id), 10, hi=100.0)
        hms(snap.taken_at_unix)


def _not_json(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes(data: bytes):
    try:
        msg = pb.Snapshot.FromString(data)
    except DecodeError:
        return
    _render_everything(msg)


finite = st.floats(allow_nan=True, allow_infinity=True)
hostile = st.one_of(
    st.text(max_size=50),
    st.just("[red]boom[/red]"), st.just("[link=file:///etc/passwd]x[/link]"),
    st.just("\x1b[2J\x1b[31mred"), st.just("x" * 5000), st.just("\u202e\u0000\ud7ff"),
)


@st.composite
def snapshots(draw) -> pb.Snapshot:  # type: ignore[no-untyped-def]
    m = pb.Snapshot(protocol_version=draw(st.sampled_from([wire.PROTOCOL_VERSION, 0, 99])),
                    taken_at_unix=draw(finite), last_seq=draw(st.integers(0, 2**64 - 1)),
                    uptime_seconds=draw(finite))
    m.process.pid = draw(st.integers(-(2**63), 2**63 - 1))
    m.process.name = draw(hostile)
    m.process.argv.extend(draw(st.lists(hostile, max_size=3)))
    m.process.engine = draw(hostile)
    for _ in range(draw(st.integers(0, 3))):
        d = m.devices.add(id=draw(st.integers(-(2**63), 2**63 - 1)), kind=draw(hostile))
        if draw(st.booleans()):
            d.memory.used_bytes = draw(st.integers(-(2**63), 2**63 - 1))
            d.memory.limit_bytes = draw(st.integers(-(2**63), 2**63 - 1))
        if draw(st.booleans()):
            d.busy_percent = draw(finite)
    for _ in range(draw(st.integers(0, 3))):
        m.counters.add(name=draw(hostile), value=draw(st.integers(-(2**63), 2**63 - 1)),
                       unit=draw(st.integers(0, 5)))
    for _ in range(draw(st.integers(0, 3))):
        d = m.distributions.add(name=draw(hostile), unit=draw(st.integers(0, 5)),
                                count=draw(st.integers(0, 2**64 - 1)), total=draw(finite))
        if draw(st.booleans()):
            d.min, d.max = draw(finite), draw(finite)
        d.percentile_percents.extend(draw(st.lists(finite, max_size=9)))
        d.percentile_values.extend(draw(st.lists(finite, max_size=9)))
        n = draw(st.integers(0, 4))
        d.recent_times_unix.extend(draw(st.lists(finite, min_size=n, max_size=n)))
        d.recent_values.extend(draw(st.lists(finite, min_size=n, max_size=n)))
        if draw(st.booleans()):
            d.rate_per_second, d.value_rate_per_second = draw(finite), draw(finite)
        d.buckets.gamma = draw(finite)
        keys = draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5))
        d.buckets.positive_keys.extend(keys)
        d.buckets.positive_counts.extend(draw(st.lists(st.integers(0, 2**64 - 1),
                                                       min_size=len(keys), max_size=len(keys))))
    for _ in range(draw(st.integers(0, 3))):
        g = m.graphs.add(hash=draw(hostile), name=draw(hostile),
                         compiles=draw(st.integers(0, 2**64 - 1)),
                         compile_seconds_total=draw(finite), first_seen_unix=draw(finite),
                         last_seen_unix=draw(finite))
        g.causes.add(description=draw(hostile), time_unix=draw(finite))
    for _ in range(draw(st.integers(0, 3))):
        e = m.events.add(seq=draw(st.integers(0, 2**64 - 1)), kind=draw(hostile),
                         detail=draw(hostile), time_unix=draw(finite))
        if draw(st.booleans()):
            e.value = draw(finite)
    return m


@FUZZ
@given(snapshots())
def test_absurd_valid_messages(msg: pb.Snapshot):
    _render_everything(msg)


FLAGS = ["--json", "-p", "--no-color", "--list_metrics", "--metric", "hbm_usage",
         "CompileTime", "-f", "percentile:[p50]", "--target", "localhost:1", "--rate", "0",
         "-1", "abc", "--timeout", "0.2", "report", "--pid", "1", "doctor", "--bogus", "",
         "[::1", ":", "--targets-file", "/nonexistent", "\x00", "-v", "--short"]


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(st.sampled_from(FLAGS), max_size=6))
def test_random_command_lines(argv, capsys, monkeypatch):
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", "/nonexistent-tpu-info-fuzz")
    rc = cli.main(["--no-discovery", "--timeout", "0.3", *argv])
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2), (argv, rc)
    assert "Traceback" not in err


def test_report_of_hostile_names_is_literal():
    msg = pb.Snapshot(protocol_version=wire.PROTOCOL_VERSION)
    msg.process.name = "[red]x[/red]\x1b[2J"
    msg.counters.add(name="[bold]C[/bold]", value=1, unit=pb.UNIT_NUMBER)
    text = render_text([TargetView("t:1", wire.snapshot_from_proto(msg))], width=120)
    assert "[red]x[/red]" in text and "\x1b" not in text


@pytest.mark.parametrize("width", [80, 160])
def test_huge_strings_are_truncated(width: int):
    msg = pb.Snapshot(protocol_version=wire.PROTOCOL_VERSION)
    msg.process.name = "n" * 100_000
    g = msg.graphs.add(hash="h" * 64, name="g" * 100_000, compiles=2)
    g.causes.add(description="c" * 100_000)
    text = render_text([TargetView("t:1", wire.snapshot_from_proto(msg))], width=width)
    assert len(text) < 20_000
    doc = json.dumps(to_json([TargetView("t:1", wire.snapshot_from_proto(msg))]))
    assert len(doc) < 100_000
