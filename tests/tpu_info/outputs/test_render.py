"""Tables, text, reasons and JSON from fixture snapshots.

Goldens live in golden/ beside this file; regenerate with ``UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from tests.fixtures.snapshots import (
    NOW,
    SCENARIOS,
    cpu_scan,
    header,
    jax_training,
    libtpu_snapshot,
    torch_eager,
    v5e_scan,
)
from tpu_info.contract.model import GraphRecord, ProcessRecord, RecompileCause, Snapshot
from tpu_info.outputs.jsonview import JSON_SCHEMA, SCHEMA
from tpu_info.outputs.render import reasons, render_text, to_json
from tpu_info.views.values import TargetView, format_bytes, format_ns, format_uptime

GOLDEN = Path(__file__).parent / "golden"
ANSI = re.compile(r"\x1b[\[\]]")


def _render(name: str, width: int, color: bool = False) -> str:
    views, local = SCENARIOS[name]()
    return render_text(views, width, color, local=local, header=header())


@pytest.mark.parametrize("width", [80, 160])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(name: str, width: int):
    out = _render(name, width)
    path = GOLDEN / f"render_{name}_{width}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1" or not path.exists():
        if os.environ.get("UPDATE_GOLDEN") != "1":
            pytest.fail(f"{path} is missing; run with UPDATE_GOLDEN=1 to write it")
        path.parent.mkdir(exist_ok=True)
        path.write_text(out, encoding="utf-8")
    assert out == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("width", [60, 72, 80, 100, 119, 120, 140, 200])
def test_fits_any_width(name: str, width: int):
    out = _render(name, width)
    assert max(cell_len(line) for line in out.splitlines()) <= width
    assert not ANSI.search(out)


def test_grows_on_wider_terminals():
    narrow, wide = _render("tpu_host", 80), _render("tpu_host", 160)
    assert "…" in narrow
    assert "jit(_very_long_function_name_from_a_gen" in wide
    assert "User" not in narrow and "alice" in wide  # optional column appears with room
    assert "██" in wide and "██" not in narrow  # HBM bars only when there is room
    # The recompile cause is a column when wide, lines under the table when narrow.
    assert "Last recompile causes:" in narrow and "Last recompile causes:" not in wide
    assert re.search(r"Execs  Last recompile cause$", wide, re.M)


def test_sections_and_values():
    out = _render("tpu_host", 160)
    for title in ("Devices", "Processes", "Compilation", "Transfers", "Findings"):
        assert f"\n{title}" in out
    assert "tpu-info 0.1.0   host tpu-vm-1   2025-06-15 15:06:40 UTC" in out
    assert "libtpu 0.0.17   accelerator TPU v5e x4   3 targets read, 1 failed" in out
    # libtpu's gauges are folded into the local chips; its owner comes from /proc.
    assert re.search(r"tpu1 +TPU v5e +/dev/vfio/13 +4\.25 GiB / 15\.75 GiB .* 91% +4242", out)
    assert re.search(r"4242 +train\.py +alice +jax 0\.10\.0 +127\.0\.0\.1:40123 +12m05s +120 +6",
                     out)
    assert re.search(r"b71e55aa90c4 +jit\(train_step\) .* at train\.py:88", out)
    # P99.9 is computed here from the buckets: the tail sample (9.5 ms) pulls it up.
    assert re.search(r"host->dev +240 +960 MiB +262 µs .* 7\.33 ms", out)
    assert "FAIL  10.0.0.7:8431" in out


def test_every_na_has_a_reason():
    for name in SCENARIOS:
        views, local = SCENARIOS[name]()
        pairs = reasons(views, local=local, header=header())
        out = render_text(views, 200, local=local, header=header())
        if "N/A" in out:
            assert pairs, name
        assert all(where and why for where, why in pairs)
    views, local = SCENARIOS["tpu_host"]()
    got = dict(reasons(views, local=local, header=header()))
    assert got["processes/10.0.0.7:8431"].startswith("connection refused")
    assert "mark_step" in got["processes/127.0.0.1:40777/steps"]
    # Two timed transfers: too few for a percentile (views.values.MIN_TIMED_SAMPLES).
    assert "only 2 timed samples (< 20)" in got["transfers/127.0.0.1:40777/h2d/p999"]
    assert "does not count executions" in got[
        "compilation/127.0.0.1:40123/0c44de12ab98/executions"]
    cpu = dict(reasons([], local=cpu_scan(), header=header()))
    assert "no TPU chips found" in cpu["header/accelerator"]
    assert "nvidia-ml-py" in cpu["devices"]


def test_chips_without_libtpu_say_why():
    views = [TargetView("localhost:8431", error="connection refused", source="libtpu")]
    local = v5e_scan(owners=((), (), (), ()), owners_reason="no permission to read /proc")
    got = dict(reasons(views, local=local, header=header()))
    assert "connection refused" in got["devices/tpu0/hbm_used"]
    assert "no permission" in got["devices/tpu0/pids"]
    out = render_text(views, 80, local=local, header=header())
    assert re.search(r"tpu0 +TPU v5e +/dev/vfio/12 +N/A / 16\.00 GiB +N/A +N/A +N/A", out)


HOSTILE = ["[red]x[/red]", "[link=file:///etc/passwd]click[/link]", "[/]", "[bold", "\\[b]"]


def test_remote_strings_are_never_markup():
    name, link, closing, unclosed, escaped = HOSTILE
    cause = RecompileCause(NOW, f"changed {unclosed} \x1b[31mred\x1b[0m", "/x/[b]t.py:1")
    s = Snapshot(
        taken_at_unix=NOW, uptime_seconds=5,
        process=ProcessRecord(pid=1, name=name, user=closing, engine=escaped,
                              versions={escaped: "[blink]1"}),
        graphs=(GraphRecord("h" * 64, link, "jax", NOW, NOW, compiles=2, causes=(cause,)),),
    )
    for color in (False, True):
        out = render_text([TargetView("[i]addr[/i]:1", s)], 200, color, header=header())
        plain = ANSI.sub("", re.sub(r"\x1b\[[0-9;]*m", "", out))
        for text in (name, link, closing, escaped, "[i]addr[/i]:1", "[b]t.py:1", unclosed):
            assert text in plain, text
        assert "\x1b]8;" not in out  # no hyperlink was made
        assert "\x1b[31mred" not in out  # the remote escape sequence was neutralised
        assert "\ufffd[31mred" in out


def test_huge_hostile_string_is_cut():
    huge = "A" * 1_000_000 + "[red]"
    s = replace(torch_eager(), process=ProcessRecord(pid=9, name=huge, engine=huge))
    out = render_text([TargetView("t:1", s)], 160, header=header())
    assert len(out) < 20_000
    assert max(len(line) for line in out.splitlines()) <= 160
    doc = to_json([TargetView("t:1", s)], header=header())
    assert len(doc["targets"][0]["process"]["name"]) == 4096


def test_json_carries_the_rank():
    s = replace(torch_eager(), process=ProcessRecord(pid=9, name="train.py", process_index=3,
                                                     process_count=8))
    doc = to_json([TargetView("t:1", s)], header=header())
    validate(doc)
    assert doc["targets"][0]["process"]["process_index"] == 3
    assert doc["targets"][0]["process"]["process_count"] == 8


def test_color_output_has_styles_and_plain_has_none():
    assert ANSI.search(_render("tpu_host", 120, color=True))
    assert not ANSI.search(_render("tpu_host", 120, color=False))


# JSON -----------------------------------------------------------------------

def _validate(instance, schema, path="$"):  # type: ignore[no-untyped-def]
    """The subset of JSON Schema that JSON_SCHEMA uses, when jsonschema is absent."""
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
             "integer": int, "number": (int, float)}
    if "const" in schema:
        assert instance == schema["const"], path
    if "enum" in schema:
        assert instance in schema["enum"], path
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(isinstance(instance, types[n]) and not (n in ("integer", "number")
                                                          and isinstance(instance, bool))
                 for n in names)
        assert ok, f"{path}: {instance!r} is not {names}"
    if isinstance(instance, int | float) and not isinstance(instance, bool):
        assert instance >= schema.get("minimum", instance), f"{path}: below minimum"
        assert instance <= schema.get("maximum", instance), f"{path}: above maximum"
    if isinstance(instance, str) and "pattern" in schema:
        assert re.search(schema["pattern"], instance), f"{path}: {instance!r} does not match"
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            assert key in instance, f"{path}: missing {key}"
        for key, sub in schema.get("properties", {}).items():
            if key in instance:
                _validate(instance[key], sub, f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in instance.items():
                if key not in schema.get("properties", {}):
                    _validate(value, extra, f"{path}.{key}")
    if isinstance(instance, list) and "items" in schema:
        for i, item in enumerate(instance):
            _validate(item, schema["items"], f"{path}[{i}]")


def validate(doc) -> None:  # type: ignore[no-untyped-def]
    try:
        import jsonschema
    except ImportError:
        _validate(doc, JSON_SCHEMA)
    else:
        jsonschema.validate(doc, JSON_SCHEMA)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_json_matches_schema(name: str):
    views, local = SCENARIOS[name]()
    doc = to_json(views, local=local, header=header())
    validate(doc)
    assert json.loads(json.dumps(doc)) == doc  # plain JSON types only
    assert doc["schema"] == SCHEMA == "tpu-info/v1"


def test_json_values_and_reasons():
    views, local = SCENARIOS["tpu_host"]()
    doc = to_json(views, local=local, header=header())
    assert doc["accelerator_type"] == "TPU v5e x4" and doc["libtpu_version"] == "0.0.17"
    chip = doc["chips"][1]
    assert chip["hbm_used_bytes"] == int(4.25 * 2**30) and chip["busy_percent"] == 91.0
    assert chip["owner_pids"] == [4242] and "hbm_used_bytes" not in chip["reasons"]
    failed, jax_t, torch_t = doc["targets"][3], doc["targets"][1], doc["targets"][2]
    assert failed["ok"] is False and failed["process"] is None and "refused" in failed["error"]
    assert jax_t["steps"] == 120 and jax_t["compiles"] == 6
    h2d = jax_t["transfers"]["h2d"]
    assert h2d["count"] == 240 and h2d["bytes"] == 240 * 4 * 2**20
    assert 7e6 < h2d["p999_ns"] <= 9.5e6 and h2d["p50_ns"] < h2d["p90_ns"] < h2d["p999_ns"]
    assert jax_t["graphs"][0]["hash"].startswith("3f9a1c0b7d2e")
    assert jax_t["graphs"][1]["last_cause"]["location"] == "/home/alice/project/train.py:88"
    assert any(f["kind"] == "per_step_sync" for f in jax_t["findings"])
    assert torch_t["steps"] is None
    assert "only 2 timed samples (< 20)" in torch_t["transfers"]["h2d"]["reasons"]["p999_ns"]
    assert torch_t["transfers"]["h2d"]["timed"] == 2
    na = {(x["where"], x["reason"]) for x in doc["na"]}
    assert ("processes/10.0.0.7:8431", "connection refused (is the hook installed there?)") in na


def test_json_without_local_scan_or_views():
    doc = to_json([], header=header())
    validate(doc)
    assert doc["chips"] == [] and doc["targets"] == [] and doc["accelerator_type"] is None


# Formatting and properties ----------------------------------------------------

@pytest.mark.parametrize("value,text", [(0, "0 B"), (472, "472 B"), (1536, "1.50 KiB"),
                                        (960 * 2**20, "960 MiB"), (19 * 2**30, "19.0 GiB")])
def test_format_bytes(value: float, text: str):
    assert format_bytes(value) == text


@pytest.mark.parametrize("value,text", [(812, "812 ns"), (1_500, "1.50 µs"),
                                        (262_000, "262 µs"), (7_330_000, "7.33 ms"),
                                        (21.5e9, "21.5 s")])
def test_format_ns(value: float, text: str):
    assert format_ns(value) == text


@pytest.mark.parametrize("s,text", [(0, "0s"), (45, "45s"), (725, "12m05s"), (3 * 3600 + 240,
                                    "3h04m"), (2 * 86400 + 3 * 3600, "2d03h"),
                                    (float("inf"), "-"), (float("nan"), "-"), (-5, "0s")])
def test_format_uptime(s: float, text: str):
    assert format_uptime(s) == text


@settings(max_examples=40, deadline=None)
@given(name=st.text(max_size=300), target=st.text(min_size=1, max_size=80),
       width=st.integers(min_value=60, max_value=220))
def test_any_strings_any_width(name: str, target: str, width: int):
    s = replace(jax_training(), process=ProcessRecord(pid=3, name=name, user=name, engine=name))
    views = [TargetView(target, s), TargetView(target, error=name),
             TargetView("localhost:8431", libtpu_snapshot(), source="libtpu")]
    out = render_text(views, width, local=v5e_scan(), header=header())
    assert max(cell_len(line) for line in out.splitlines()) <= width
    validate(to_json(views, local=v5e_scan(), header=header()))


@pytest.mark.slow
def test_render_imports_nothing_heavy():
    from tests.conftest import run_python

    code = ("import sys, tpu_info.outputs.render, tpu_info.host.devices, tpu_info.outputs.jsonview\n"
            "bad = [m for m in ('torch', 'jax', 'metrics', 'tui', 'profiler', 'grpc')"
            " if m in sys.modules]\nprint(bad)")
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


@pytest.mark.slow
def test_outputs_are_siblings_over_one_view():
    """--json, the text report and the tables each read tpu_info.views.derived; none
    renders another (the N/A list once came from drawing the tables at width
    10,000, so `jsonview` imported `render`)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from tests.fixtures.snapshots import SCENARIOS, header\n"
            "from tpu_info.outputs.jsonview import to_json\n"
            "from tpu_info.outputs.textreport import metrics_report\n"
            "views, local = SCENARIOS['tpu_host']()\n"
            "doc = to_json(views, local=local, header=header())\n"
            "[metrics_report(v.snapshot) for v in views if v.snapshot]\n"
            "assert doc['na'], doc\n"
            "print(sorted(m for m in sys.modules if m.startswith(('tpu_info.outputs.render', 'rich'))))\n")
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    # ... and the N/A list is the tables': every N/A drawn has its reason there.
    views, local = SCENARIOS["tpu_host"]()
    doc = to_json(views, local=local, header=header())
    assert [(n["where"], n["reason"]) for n in doc["na"]] == reasons(views, local=local,
                                                                     header=header())


def test_metric_view_says_the_same_why_as_the_tables():
    from rich.console import Console

    from tpu_info.outputs.metric_tables import metric_table
    views, local = SCENARIOS["cpu_host"]()
    why = dict(reasons(views, local=local, header=header()))
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(metric_table("duty_cycle_percent", views))
    busy = next(r for w, r in why.items() if w.startswith("devices/127.0.0.1") and
                w.endswith("/busy"))
    assert f"N/A: {busy}" in console.export_text()
