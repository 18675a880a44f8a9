"""After the run: a hooked JAX program saves its last snapshot when it ends
(normally, by an exception, by SIGTERM), and the CLI reads the file as it reads
a live program: the table, --json, report, doctor, runs, diff with --fail-on.
Real JAX programs in subprocesses, the real CLI in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tpu_info.commands.cli import main
from tpu_info.views.findings import find
from tpu_info.wire import runfile

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = textwrap.dedent("""
    import os, sys, time
    import metrics; metrics.install(serve=False)
    import jax, jax.numpy as jnp, numpy as np
    f = jax.jit(lambda w, x: (x @ w).sum())
    w = jnp.ones((64, 8))
    short = os.environ.get("SHORT") == "1"
    for i in range(40):
        rows = 31 if short and i % 10 == 9 else 32
        float(f(w, np.ones((rows, 64), np.float32)))
        metrics.mark_step()
    print("ready", flush=True)
    if os.environ.get("END") == "raise":
        raise ValueError("bad batch")
    if os.environ.get("END") == "wait":
        time.sleep(60)
""")


def _env(tmp_path: Path, **kw: str) -> dict[str, str]:
    """A hooked program's environment that saves where the hook would by
    default (the suite turns saving off elsewhere)."""
    env = dict(os.environ, TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"), PYTHONPATH=str(ROOT),
               **kw)
    env.pop("TPU_INFO_SAVE", None)
    return env


def _checkpointed(folder: Path, pid: int | str, steps: int, within: float = 60.0) -> None:
    """Waits until the run's checkpoint holds ``steps`` steps."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        for path in folder.glob(f"*-{pid}-*.tpurun"):
            try:
                s = runfile.read(path).snapshot
            except runfile.RunFileError:
                continue
            if s.steps is not None and s.steps.count >= steps:
                return
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of {steps} steps in {within} s")


def _run(tmp_path: Path, end: str = "", short: bool = False,
         serve: str = "off") -> tuple[int, Path]:
    code = PROGRAM.replace("serve=False", f"serve={serve!r}") if serve != "off" else PROGRAM
    env = _env(tmp_path, END=end, SHORT="1" if short else "0")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    if end == "wait":
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        if serve == "off":  # no handler: SIGTERM kills it; the checkpoint stays
            _checkpointed(tmp_path / "rt" / "runs", p.pid, 40)
        p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    runs = sorted((tmp_path / "rt" / "runs").glob(f"*-{p.pid}-*.tpurun"))
    assert len(runs) == 1, list((tmp_path / "rt").rglob("*"))
    return p.returncode, runs[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saved")
    return {end or "exit": _run(tmp, end) for end in ("", "raise", "wait")} | {
        "short": _run(tmp, "", short=True), "wait_served": _run(tmp, "wait", serve="thread")}


def test_each_way_of_ending_is_saved_and_said(runs):
    assert runs["exit"][0] == 0 and runfile.read(runs["exit"][1]).how_it_ended() == "exit"
    rc, path = runs["raise"]
    assert rc == 1 and runfile.read(path).how_it_ended() == "exception: ValueError: bad batch"
    rc, path = runs["wait_served"]  # the in-process exporter's handler saves it
    assert rc == -signal.SIGTERM and runfile.read(path).how_it_ended() == "SIGTERM"
    rc, path = runs["wait"]  # no handler (nothing delays the end): the last checkpoint
    killed = runfile.read(path)
    assert rc == -signal.SIGTERM and killed.how_it_ended().startswith(
        "ended without its exit work") and killed.snapshot.steps.count == 40
    snap = runfile.read(runs["exit"][1]).snapshot
    assert snap.steps.count == 40 and snap.process.name == "-c"
    assert any(e.kind == "compile" for e in snap.events)  # events included
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_cli_reads_a_saved_run_as_a_live_one(runs, capsys):
    path = str(runs["short"][1])
    assert main(["--from", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (target,) = doc["targets"]
    assert target["steps"] == 40 and target["ok"]
    assert any(f["kind"] == "recompile_short_last_batch" for f in target["findings"])
    assert main(["report", "--from", path]) == 0
    assert "recompile_short_last_batch" in capsys.readouterr().out
    assert main(["doctor", "--from", path]) == 0
    assert "read from a file: the program ended (exit)" in capsys.readouterr().out


def test_the_saved_run_keeps_device_memory(runs, capsys, tmp_path):
    """The program installs the hook before it imports JAX, whose own exit
    handler clears its backends: the end's save runs before it, so the run
    keeps its devices (the TPU machine's run said 'the process reported no
    devices')."""
    path = str(runs["exit"][1])
    devices = runfile.read(path).snapshot.devices
    used = sum(d.memory.used_bytes or 0 for d in devices)
    assert devices and used > 0, devices
    assert main(["--from", path, "--json"]) == 0
    (target,) = json.loads(capsys.readouterr().out)["targets"]
    assert target["hbm_used_bytes"] == used and len(target["devices"]) == len(devices)
    html = tmp_path / "r.html"
    assert main(["report", "--from", path, "--html", str(html)]) == 0
    assert "reported no devices" not in html.read_text()


def test_runs_lists_them_newest_first(runs, capsys, monkeypatch):
    folder = runs["exit"][1].parent
    monkeypatch.setenv("TPU_INFO_RUNTIME_DIR", str(folder.parent))
    assert main(["runs", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["runs"]) == 5 and {r["ended"] for r in doc["runs"]} == {
        "exit", "exception: ValueError: bad batch", "SIGTERM",
        "ended without its exit work (SIGTERM or SIGKILL; saved while running)"}
    assert all(r["steps"] == 40 for r in doc["runs"])


def test_diff_fails_the_gate_on_a_run_that_adds_a_recompile(runs, capsys):
    a, b = str(runs["exit"][1]), str(runs["short"][1])
    assert main(["diff", a, b, "--fail-on", "compiles>+0"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  compiles>+0: compiles +1" in out
    assert "jit(<lambda>)(x: f32[31,64]" in out or "f32[31,64]" in out
    assert main(["diff", a, a, "--fail-on", "compiles>+0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fail_on"] == [{"condition": "compiles>+0: compiles +0 (3 -> 3)", "held": False}] \
        or not doc["fail_on"][0]["held"]


@pytest.mark.parametrize("content", [b"", b"garbage", runfile.MAGIC + b"\xff" * 64])
def test_a_file_that_is_not_a_saved_run_is_one_line_and_exit_1(tmp_path, capsys, content):
    bad = tmp_path / "bad.tpurun"
    bad.write_bytes(content)
    for argv, code in ((["--from", str(bad)], 1), (["report", "--from", str(bad)], 1),
                       (["diff", str(bad), str(bad)], 2)):
        assert main(argv) == code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err


def test_saving_off_and_a_chosen_file(tmp_path):
    env = _env(tmp_path)
    chosen = tmp_path / "mine.tpurun"
    for setting, expect in (("off", None), (str(chosen), chosen)):
        subprocess.run([sys.executable, "-c", PROGRAM], env=dict(env, TPU_INFO_SAVE=setting),
                       check=True, capture_output=True, timeout=120, cwd=tmp_path)
        if expect is None:
            assert not (tmp_path / "rt" / "runs").exists()
        else:
            assert runfile.read(expect).snapshot.steps.count == 40


def test_a_forked_child_saves_nothing_of_its_parents(tmp_path):
    code = PROGRAM + textwrap.dedent("""
        pid = os.fork()
        if pid == 0:
            os._exit(0) if os.environ.get("HARD") else sys.exit(0)
        os.waitpid(pid, 0)
    """)
    env = _env(tmp_path)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                   timeout=120, cwd=tmp_path)
    saved = list((tmp_path / "rt" / "runs").glob("*.tpurun"))
    assert len(saved) == 1  # the parent's only


def test_tpu_info_run_prints_the_summary_after_its_child_ended(tmp_path):
    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM.replace("metrics.install(serve=False)", "pass"))
    env = _env(tmp_path, TPU_INFO_SERVE="0", SHORT="1")
    tpu_info = [sys.executable, "-m", "tpu_info", "run"]
    r = subprocess.run(tpu_info + ["--summary", "--", sys.executable, str(prog)], env=env,
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("tpu-info: train.py (pid ") and "ended (exit 0)" in lines[0]
    assert lines[1].startswith("  steps 40 (") and "step time P50" in lines[1]
    assert any("recompile_short_last_batch at train.py:" in line for line in lines), lines
    assert lines[-1].startswith("  saved: ") and "tpu-info report --from FILE" in lines[-1]
    quiet = subprocess.run(tpu_info + ["--no-summary", "--", sys.executable, str(prog)],
                           env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert quiet.returncode == 0 and "tpu-info:" not in quiet.stderr
    off = subprocess.run(tpu_info + ["--summary", "--", sys.executable, str(prog)],
                         env=dict(env, TPU_INFO_SAVE="off"), capture_output=True, text=True,
                         timeout=180, cwd=tmp_path)
    assert "ended (exit 0)" in off.stderr and "saved:" not in off.stderr
    assert len(list((tmp_path / "rt" / "runs").glob("*.tpurun"))) == 2  # not the third


def test_tpu_info_run_summarises_no_program_that_started_before_it(tmp_path):
    """Another of the user's programs that ends while the child runs (its run
    saved since) is not the child's: its summary is not printed (the eval of
    eight programs run one after another printed the previous one's too)."""
    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM.replace("metrics.install(serve=False)", "pass"))
    env = _env(tmp_path, TPU_INFO_SERVE="0", SHORT="1")
    tpu_info = [sys.executable, "-m", "tpu_info", "run"]
    first = subprocess.run(tpu_info + ["--no-summary", "--", sys.executable, str(prog)],
                           env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (earlier,) = (tmp_path / "rt" / "runs").glob("*.tpurun")
    time.sleep(1.5)  # its start now more than the clock's slack before the next
    os.utime(earlier)  # as if it ended (saved) after the next one began
    r = subprocess.run(tpu_info + ["--summary", "--", sys.executable, str(prog)], env=env,
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    heads = [x for x in r.stderr.splitlines() if x.startswith("tpu-info: train.py (pid ")]
    assert len(heads) == 1 and f"(pid {runfile.read(earlier).snapshot.process.pid})" \
        not in heads[0], heads


def test_tpu_info_run_on_sigterm_says_only_where_the_run_is(tmp_path):
    # A grace period is running: no summary to build, one line at most.
    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM.replace("metrics.install(serve=False)", "pass"))
    env = _env(tmp_path, TPU_INFO_SERVE="0", END="wait")
    p = subprocess.Popen([sys.executable, "-m", "tpu_info", "run", "--summary", "--",
                          sys.executable, str(prog)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    _checkpointed(tmp_path / "rt" / "runs", "*", 40)  # the child has no handler: killed
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    (line,) = [x for x in err.splitlines() if x.startswith("tpu-info:")]
    assert line.startswith("tpu-info: saved ") and line.endswith("(tpu-info report --from FILE)")
    (saved,) = (tmp_path / "rt" / "runs").glob("*.tpurun")
    assert runfile.read(saved).how_it_ended().startswith("ended without its exit work")


TORCH_PROGRAM = textwrap.dedent("""
    import os, time
    import metrics; metrics.install(serve=False)
    import torch
    model = torch.compile(torch.nn.Linear(16, 4), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(30):
        rows = 7 if i == 29 else 8
        loss = model(torch.randn(rows, 16)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
    print("ready", flush=True)
    if os.environ.get("END") == "raise":
        raise RuntimeError("loss is nan")
    if os.environ.get("END") == "wait":
        time.sleep(60)
""")


@pytest.mark.parametrize("end", ["raise", "wait"])
def test_a_torch_compile_program_that_crashes_or_is_stopped_leaves_a_readable_run(
        tmp_path, end):
    pytest.importorskip("torch")
    p = subprocess.Popen([sys.executable, "-c", TORCH_PROGRAM], env=_env(tmp_path, END=end),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path)
    if end == "wait":
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        _checkpointed(tmp_path / "rt" / "runs", p.pid, 30)
        p.send_signal(signal.SIGTERM)
    p.communicate(timeout=180)
    (path,) = (tmp_path / "rt" / "runs").glob(f"*-{p.pid}-*.tpurun")
    run = runfile.read(path)
    assert run.snapshot.steps.count == 30 and run.snapshot.process.engine.startswith("torch")
    if end == "raise":
        assert p.returncode == 1 and run.how_it_ended() == "exception: RuntimeError: loss is nan"
        kinds = {f.kind for f in find(run.snapshot)}
        assert "recompile_short_last_batch" in kinds or any(k.startswith("recompile")
                                                            for k in kinds), kinds
    else:
        assert p.returncode == -signal.SIGTERM
        assert run.how_it_ended().startswith("ended without its exit work")
