"""``tpu-info report --html`` of a real hooked JAX program, opened in a real browser.

The program runs a jitted step 41 times with ``metrics.mark_step()``: one
step sleeps (a slow step), the last batch is short (a recompile), every step
reads its loss with ``float()`` (a per-step sync); then it serves. The CLI
writes the page over real gRPC; Debian's ``chromium``, driven by
Playwright (no browser download), opens it: it must render, load nothing,
log no error, and show one point per step sample, the slow steps and
compiles marked, every finding and every graph.
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
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
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
