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
