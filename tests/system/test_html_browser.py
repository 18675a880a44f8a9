"""``tpu-info report --html`` of a real hooked JAX program, opened in a real browser.

The program runs a jitted step 41 times with ``metrics.mark_step()``: one
step sleeps (a slow step), the last batch is short (a recompile), every step
reads its loss with ``float()`` (a per-step sync); then it serves. The CLI
writes the page over real gRPC; Debian's ``chromium``, driven by
Playwright (no browser download), opens it: it must render, load nothing,
log no error, and show one point per step sample, the slow steps and
compiles marked, every finding and every graph. A second program marks
3,000 steps, two of them slow: its plot spans the whole run in a bounded
number of points (buckets of consecutive steps), and both slow steps show.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tpu_info.contract.model import COMPILE_KINDS, Snapshot
from tpu_info.net.client import Client
from tpu_info.views.derived import findings_of
from tpu_info.views.slow_steps import outliers

pytestmark = pytest.mark.slow

PROGRAM = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
import metrics

metrics.install(engines=["jax"], serve=True)

@jax.jit
def step(w, x):
    loss = lambda w: ((x @ w) ** 2).mean()
    return w - 0.01 * jax.grad(loss)(w), loss(w)

w = jnp.ones((16, 4))
data = np.random.default_rng(0).normal(size=(40 * 32 + 8, 16)).astype(np.float32)
for i in range(41):
    w, loss = step(w, jnp.asarray(data[i * 32:(i + 1) * 32]))  # the last batch is short
    float(loss)  # a read of the loss in every step
    time.sleep(0.2 if i == 20 else 0.01)  # step 20 is slow
    metrics.mark_step()
print(json.dumps({"address": metrics.exporter().address}), flush=True)
sys.stdin.read()
"""

# 3,000 marked steps of ~1 ms, steps 300 and 2,700 slow: the whole run, not its last 64.
LONG_PROGRAM = r"""
import json, sys, time
import metrics

metrics.install(engines=[], serve=True)
for i in range(3000):
    time.sleep(0.25 if i in (300, 2700) else 0.001)
    metrics.mark_step()
print(json.dumps({"address": metrics.exporter().address}), flush=True)
sys.stdin.read()
"""

CHROMIUM = "/usr/bin/chromium"


def _browser_or_skip() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]'; it drives the "
                    "system chromium, no browser download)")
    path = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run does)")
    return sync_playwright, path


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Snapshot]]:
    """The page ``tpu-info report --html`` wrote, and the snapshot it was made from."""
    yield from _report_of(PROGRAM, tmp_path_factory)


@pytest.fixture(scope="module")
def written_long(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Snapshot]]:
    """The same for the 3,000-step program."""
    yield from _report_of(LONG_PROGRAM, tmp_path_factory)


def _report_of(program: str, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[Path, Snapshot]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"hooked program did not start: {err[-2000:]}")
        address = json.loads(line)["address"]
        out = tmp_path_factory.mktemp("html") / "report.html"
        r = subprocess.run([sys.executable, "-m", "tpu_info", "--timeout", "20", "report",
                            "--target", address, "--html", str(out)], capture_output=True,
                           text=True, timeout=60, env=env, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"wrote {out}")
        with Client(address, timeout=20) as c:  # the program is idle: the same records
            snap = c.snapshot()
        yield out, snap
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_file_is_self_contained(written: tuple[Path, Snapshot]) -> None:
    page = written[0].read_text()
    assert len(page.encode()) < 300_000
    assert "http://" not in page and "https://" not in page
    for tag in ("<script", "<link", "<img", "<iframe", " src=", " href="):
        assert tag not in page


def test_it_renders_in_chromium(written: tuple[Path, Snapshot]) -> None:
    sync_playwright, chromium = _browser_or_skip()
    path, snap = written
    steps = snap.distribution("StepTime")
    assert steps is not None and len(steps.recent) == 40
    assert steps.series is not None and len(steps.series) == 40  # one step a bucket
    slow = outliers(steps)[2]
    compiles = [e for e in snap.events if e.kind in COMPILE_KINDS]
    findings = findings_of(snap)
    assert {f.kind for f in findings} >= {"recompile_short_last_batch", "per_step_sync"}
    assert slow, "step 20 slept 0.2 s: an outlier"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            requests: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")

            assert page.title().startswith("tpu-info report: ")
            plot = page.locator("#steps svg")
            box = plot.bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 50  # drawn
            assert page.locator("#steps svg circle").count() == len(steps.recent)
            assert page.locator("#steps svg circle.slow").count() == len(slow)
            first = min(t - v / 1e9 for t, v in steps.recent)
            in_steps = [e for e in compiles if e.time_unix >= first]
            assert in_steps, "the recompile of the short last batch ended in the last step"
            assert page.locator("#steps svg line.mark").count() == len(in_steps)
            assert page.locator("#compiles svg rect.compile, #compiles svg rect.recompile"
                                ).count() == len(compiles)
            assert page.locator("#compiles svg rect.recompile").count() >= 1
            assert page.locator("#hbm svg rect.used").count() == sum(
                d.memory.used_bytes is not None for d in snap.devices)
            rows = page.locator("#findings tbody tr")
            assert rows.count() == len(findings)
            text = page.locator("#findings").inner_text()
            for f in findings:
                assert f.kind in text
            assert "float()" in text  # the per-step read, in the finding's words
            assert page.locator("#graphs tbody tr").count() == len(snap.graphs)
            assert errors == []
            assert requests == [path.as_uri()]  # the page itself, nothing else
        finally:
            browser.close()


def test_a_long_run_is_plotted_whole_in_bounded_points(
        written_long: tuple[Path, Snapshot]) -> None:
    """Issue 43: the plot covered the last 64 steps of a run. 2,999 step
    samples are 188 points of 16 consecutive steps, spread over the whole
    plot's width, and the two slow steps (at 10% and 90% of the run) are two
    red points whose lines reach their 250 ms."""
    sync_playwright, chromium = _browser_or_skip()
    path, snap = written_long
    steps = snap.distribution("StepTime")
    assert steps is not None and steps.count == 2999 and len(steps.recent) == 64
    series = steps.series
    assert series is not None and series.count == 2999 and series.width == 16
    assert len(series) == 188
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            plot = page.locator("#steps svg")
            box = plot.bounding_box()
            assert box is not None and box["width"] > 300
            points = page.locator("#steps svg circle")
            assert points.count() == len(series) == 188
            xs = [b["x"] + b["width"] / 2 for b in
                  (points.nth(i).bounding_box() for i in range(points.count())) if b]
            # From the plot's left edge to its right: the whole run, not its end.
            assert min(xs) - box["x"] < 0.15 * box["width"]
            assert box["x"] + box["width"] - max(xs) < 0.1 * box["width"]
            # The two sleeps are red, with their 250 ms kept as the bucket's slowest
            # (a 1 ms sleep on a loaded machine may be slow too: more red is fine).
            slow = page.locator("#steps svg circle.slow")
            titles = [slow.nth(i).locator("title").text_content() or "" for i in range(slow.count())]
            spiked = [t for t in titles if "slowest 2" in t and " ms (slow)" in t
                      and float(t.split("slowest ")[1].split(" ms")[0]) >= 250]
            assert [t.split(" (")[0] for t in spiked] == [
                "step samples 289-304", "step samples 2,689-2,704"], titles
            lines = page.locator("#steps svg line.range.slow")
            tall = [b for b in (lines.nth(i).bounding_box() for i in range(lines.count()))
                    if b is not None and b["height"] > 0.5 * box["height"]]
            assert len(tall) == 2  # the spikes reach up the plot
            note = page.locator("#step-plot-note").inner_text()
            assert "The whole run: 2,999 step samples in 188 points of 16" in note
            assert errors == []
        finally:
            browser.close()
