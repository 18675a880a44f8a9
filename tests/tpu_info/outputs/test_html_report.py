"""The HTML report as a pure function of a snapshot: hostile strings escaped,
plots with one mark per sample, a reason where there is no plot, bounded size;
and ``tpu-info report --html``'s refusals and write failure (one line, exit code).

The browser check of a real hooked program's page is tests/system/test_html_browser.py.
"""

from __future__ import annotations

from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.fixtures.snapshots import NOW, dist, jax_training
from tpu_info.commands.cli import main
from tpu_info.commands.report_html import write_report
from tpu_info.contract.model import (
    DeviceRecord,
    Event,
    EventKind,
    GraphRecord,
    MemoryReading,
    ProcessRecord,
    RecompileCause,
    Samples,
    Snapshot,
    StepsReading,
    Unit,
)
from tpu_info.contract.series import RunSeries
from tpu_info.outputs.html import report_html
from tpu_info.views.slow_steps import outliers

HOSTILE = "<script>alert('x')</script>\"><img src=x onerror=alert(1)>"
# Every element the page may contain: anything else got in unescaped.
ALLOWED = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "section", "dl",
           "dt", "dd", "code", "span", "table", "thead", "tbody", "tr", "th", "td", "ul", "li",
           "svg", "line", "text", "rect", "circle"}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.update(a for a, _ in attrs)


def _parsed(page: str) -> _Tags:
    p = _Tags()
    p.feed(page)
    return p


def _step_snapshot(n: int = 40, slow_at: tuple[int, ...] = (20,)) -> Snapshot:
    """Marked steps of 10 ms (slow ones 200 ms), a first compile and a recompile."""
    values = [200e6 if i in slow_at else 10e6 * (1 + (i % 3) / 10) for i in range(n)]
    times = [NOW + 1.0 + 0.02 * i for i in range(n)]
    d = dist("StepTime", Unit.TIME_NS, values)
    d = replace(d, recent=Samples(times, values))
    events = (Event(1, NOW + 0.5, EventKind.COMPILE, "jit(step)", "a" * 64, "", None, 0.3),
              Event(2, times[30], EventKind.RECOMPILE, "jit(step)", "b" * 64,
                    "argument 'x' changed f32[32,16] -> f32[8,16]", "/w/train.py:16", 0.08))
    return Snapshot(NOW + 3.0, ProcessRecord(1, "train.py", start_time_unix=NOW),
                    distributions=(d,), events=events,
                    steps=StepsReading(n, "marked", seconds_total=n * 0.02,
                                       first_unix=NOW + 1.0, last_unix=times[-1]))


def test_hostile_strings_are_escaped_everywhere() -> None:
    cause = RecompileCause(NOW, HOSTILE, location=f"/w/{HOSTILE}.py:3", argument=HOSTILE)
    g = GraphRecord("c" * 64, HOSTILE, HOSTILE, NOW, NOW, compiles=2,
                    compile_seconds_total=1.5, executions=3, causes=(cause,))
    s = Snapshot(
        NOW + 5, ProcessRecord(7, HOSTILE, argv=(HOSTILE, "'quoted' \"arg\""), host=HOSTILE,
                               engine="jax", start_time_unix=NOW),
        devices=(DeviceRecord(0, HOSTILE, HOSTILE, MemoryReading(100, 200, 1000, HOSTILE)),
                 DeviceRecord(1, "cpu", "cpu", MemoryReading(None, reason=HOSTILE))),
        graphs=(g,),
        events=(Event(1, NOW + 1, EventKind.RECOMPILE, HOSTILE, "c" * 64, HOSTILE,
                      f"/w/{HOSTILE}:1", 0.5),),
        blind_spots=(HOSTILE,), left_out=((HOSTILE, HOSTILE),))
    page = report_html(s, target=HOSTILE)
    tags = _parsed(page)
    assert tags.tags <= ALLOWED, tags.tags - ALLOWED
    assert "onerror" not in tags.attrs and "src" not in tags.attrs
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;" in page and "&quot;" in page and "&#x27;quoted&#x27;" in page


def test_no_step_samples_says_why() -> None:
    page = report_html(jax_training())
    assert 'id="no-step-plot"' in page and "marks no steps" in page
    assert "<circle" not in page


def test_one_point_per_step_sample_and_slow_ones_marked() -> None:
    s = _step_snapshot()
    page = report_html(s)
    d = s.distribution("StepTime")
    assert d is not None
    assert page.count("<circle") == len(d.recent) == 40
    assert page.count('<circle class="slow"') == len(outliers(d)[2]) == 1
    assert page.count('class="mark recompile"') == 1  # in the steps shown
    assert page.count('<rect class="compile"') == page.count('<rect class="recompile"') == 1
    assert "1 compile(s) ended before the first step shown" in page
    assert 'class="loop"' in page  # the step loop shaded on the timeline
    # A hook (or saved run) from before whole-run series: its last samples, said so.
    assert "The last 40 of 40 steps (the program&#x27;s hook keeps no whole-run series)" in page


def test_a_step_far_above_the_rest_puts_the_plot_on_a_log_scale() -> None:
    s = _step_snapshot()
    assert "log scale" not in report_html(s)
    d = s.distribution("StepTime")
    assert d is not None
    values = list(d.recent.values) if isinstance(d.recent, Samples) else []
    values[5] = 3e9  # a 3 s step among 10 ms ones: the rest would be one flat line
    times = [t for t, _ in d.recent]
    far = replace(s, distributions=(replace(d, recent=Samples(times, values)),))
    page = report_html(far)
    assert "step time (ms, log scale)" in page
    assert page.count("<circle") == 40


def test_memory_is_shown_as_a_moment_with_reasons() -> None:
    page = report_html(jax_training())
    assert 'id="hbm-note"' in page and "no memory series over time" in page
    assert page.count('<rect class="used"') == len(jax_training().devices)


def test_page_stays_small_and_loads_nothing() -> None:
    graphs = tuple(GraphRecord(f"{i:064x}", f"jit(f{i})", "jax", NOW + i, NOW + i, compiles=1,
                               compile_seconds_total=0.1 + i * 1e-4) for i in range(2000))
    events = tuple(Event(i, NOW + i * 0.01, EventKind.COMPILE, f"jit(f{i})", "", "", None, 0.05)
                   for i in range(1024))
    s = _step_snapshot()
    big = Snapshot(s.taken_at_unix + 20, s.process, distributions=s.distributions,
                   graphs=graphs, events=events, steps=s.steps)
    page = report_html(big)
    assert len(page.encode()) < 500_000, len(page)
    assert "http://" not in page and "https://" not in page
    assert "default-src &#x27;none&#x27;" in page  # the CSP forbids any fetch
    assert "1,800 more graph(s)" in page and "(other functions)" in page


def test_html_refuses_json_short_and_a_directory(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--json"], ["--short"]):
        assert main(["report", "--target", "127.0.0.1:9", "--html", str(tmp_path / "r.html"),
                     *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--html writes the whole page" in err
    assert main(["report", "--target", "127.0.0.1:9", "--html", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_write_failure_is_one_line_and_exit_1(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    lines: list[object] = []
    assert write_report(str(tmp_path / "file" / "r.html"), "t", jax_training(),
                        lines.append) == 1
    assert len(lines) == 1 and "cannot write the report" in str(lines[0])
    out = tmp_path / "r.html"
    out.write_text("older page")
    assert write_report(str(out), "t", jax_training(), lines.append) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary


def test_a_recompile_events_hover_tells_its_typed_cause() -> None:
    """The event's detail is the cause's description: the hover says the typed
    cause behind it (here Dynamo's guard, whatever its words), the rest kept."""
    cause = RecompileCause(NOW, "0/0: a guard in words of a newer Dynamo", argument="x",
                           before="4", after="8", kind="batch_size", dim=0, guard="size")
    g = GraphRecord("d" * 64, "compile(f)", "torch_compile", NOW, NOW, compiles=2,
                    causes=(cause,))
    e = Event(1, NOW + 1, EventKind.RECOMPILE, "compile(f)", "d" * 64,
              cause.description + "; backend cache hit", "/w/t.py:1", 0.5)
    s = Snapshot(NOW + 5, ProcessRecord(7, "t.py", engine="torch_compile",
                                        start_time_unix=NOW), graphs=(g,), events=(e,))
    page = report_html(s)
    assert "tensor &#x27;x&#x27; size mismatch at index 0: 4 -&gt; 8; backend cache hit" in page
    assert "newer Dynamo" not in page


def _long_run(n: int = 10_000, spikes: tuple[int, ...] = (100, 9_000),
              width: int = 64) -> Snapshot:
    """``n`` steps of 10 ms (200 ms at ``spikes``) as the hook keeps them: the
    last 64 as recent samples, the whole run in buckets of ``width``."""
    values = [200e6 if i in spikes else 10e6 * (1 + (i % 3) / 10) for i in range(n)]
    times = [NOW + 1.0 + 0.011 * (i + 1) for i in range(n)]
    cuts = range(0, n, width)
    series = RunSeries(width, [times[a] for a in cuts],
                       [times[min(a + width, n) - 1] for a in cuts],
                       [len(values[a:a + width]) for a in cuts],
                       [sum(values[a:a + width]) for a in cuts],
                       [min(values[a:a + width]) for a in cuts],
                       [max(values[a:a + width]) for a in cuts])
    d = replace(dist("StepTime", Unit.TIME_NS, values),
                recent=Samples(times[-64:], values[-64:]), series=series)
    events = (Event(1, NOW + 0.5, EventKind.COMPILE, "jit(step)", "a" * 64, "", None, 0.3),
              Event(2, times[n // 2], EventKind.RECOMPILE, "jit(step)", "b" * 64,
                    "argument 'x' changed f32[32,16] -> f32[8,16]", "/w/train.py:16", 0.08))
    return Snapshot(times[-1] + 1.0, ProcessRecord(1, "train.py", start_time_unix=NOW),
                    distributions=(d,), events=events, last_seq=2,
                    steps=StepsReading(n + 1, "marked", seconds_total=sum(values) / 1e9,
                                       first_unix=NOW + 1.0, last_unix=times[-1]))


def test_the_step_plot_spans_the_whole_run_in_bounded_points_and_keeps_its_spikes() -> None:
    """Issue 43: the plot covered the last 64 steps. Now 10,000 steps are
    157 points (buckets of 64 consecutive steps: mean, line from fastest to
    slowest), from the first step to the last, and both slow steps show."""
    s = _long_run()
    page = report_html(s)
    series = s.distributions[0].series
    assert series is not None and len(series) == 157
    assert page.count("<circle") == 157  # one per bucket, not one per step
    assert page.count('<circle class="slow"') == 2  # the buckets of steps 100 and 9,000
    assert page.count('<line class="range slow"') == 2
    assert "step samples 1-64 (64)" in page and "step samples 9,985-10,000 (16)" in page
    assert "slowest 200 ms (slow)" in page
    assert "The whole run: 10,000 step samples in 157 points of 64" in page
    assert "The last 64" not in page
    assert page.count('class="mark recompile"') == 1  # mid-run: inside the plot now
    assert len(page.encode()) < 300_000


def test_a_short_run_is_one_point_per_step() -> None:
    s = _long_run(n=120, spikes=(30,), width=1)
    page = report_html(s)
    assert page.count("<circle") == 120 and page.count('<circle class="slow"') == 1
    assert "All 120 step samples, one point each." in page
    assert "<line class=\"range" not in page


def test_a_run_saved_before_whole_run_series_still_reads_and_plots_its_last_steps(
        tmp_path: Path) -> None:
    """A saved run written by an older hook has no ``series`` field (the
    wire's field 15 of Distribution): ``report --from --html`` reads it and
    plots its last 64 steps, saying so; a new one plots the whole run."""
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire import runfile
    from tpu_info.wire.codec import snapshot_to_proto

    msg = snapshot_to_proto(_long_run())
    new = msg.SerializeToString()
    for d in msg.distributions:
        d.ClearField("series")  # what an older hook wrote
    assert pb.Distribution.DESCRIPTOR.fields_by_name["series"].number == 15
    for name, data, words in (("old", msg.SerializeToString(), "The last 64 of 10,000 steps"),
                              ("new", new, "The whole run: 10,000 step samples in 157")):
        run = tmp_path / f"{name}{runfile.SUFFIX}"
        runfile.write(run, runfile.encode(data, "exit", NOW + 200.0))
        out = tmp_path / f"{name}.html"
        assert main(["report", "--from", str(run), "--html", str(out)]) == 0
        assert words in out.read_text()
