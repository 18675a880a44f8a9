"""``metrics.install()`` as a program's first lines: engines imported later are hooked.

Real programs in subprocesses: install first, then ``import jax`` (or torch),
and what the snapshot, the discovery record, ``doctor`` and the report say
before and after the engine's import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "tpu_info"]

# Prints one JSON line per stage; waits for a line on stdin before importing jax.
JAX_LATE = textwrap.dedent("""
    import json, sys
    import metrics
    metrics.install(serve="thread", port=0)

    def state():
        s = metrics.snapshot()
        fs = [g for g in s.graphs if g.name == "jit(f)"]
        return {"engine": s.process.engine, "waiting": getattr(s.process, "waiting", ""),
                "address": metrics.exporter().address,
                "report": metrics.metrics_report(),
                "compiles": sum(g.compiles for g in fs),
                "causes": [c.description for g in fs for c in g.causes]}

    print(json.dumps(state()), flush=True)
    sys.stdin.readline()
    print("jax before import:", "jax" in sys.modules, file=sys.stderr)
    import jax, jax.numpy as jnp

    @jax.jit
    def f(x):
        return x * 2

    f(jnp.ones(3)).block_until_ready()
    f(jnp.ones(4)).block_until_ready()
    print(json.dumps(state()), flush=True)
    sys.stdin.readline()
""")

TORCH_LATE = textwrap.dedent("""
    import json
    import metrics
    metrics.install(serve=False)
    import torch

    def double(x):
        return x * 2

    g = torch.compile(double, backend="eager", dynamic=False)
    g(torch.ones(3))
    g(torch.ones(4))
    s = metrics.snapshot()
    print(json.dumps({"engine": s.process.engine, "waiting": getattr(s.process, "waiting", ""),
                      "compiles": sum(g.compiles for g in s.graphs),
                      "causes": [c.description for g in s.graphs for c in g.causes]}))
""")


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TPU_INFO_RUNTIME_DIR"] = str(tmp_path / "rt")
    env["TPU_INFO_PORT"] = "0"
    env["JAX_PLATFORMS"] = "cpu"
    env["COLUMNS"] = "160"
    return env


def _record(env: dict[str, str]) -> dict:
    (path,) = Path(env["TPU_INFO_RUNTIME_DIR"]).glob("*.json")
    return json.loads(path.read_text())


def _doctor(env: dict[str, str], address: str) -> str:
    r = subprocess.run([*CLI, "--target", address, "--no-discovery", "doctor"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    return r.stdout + r.stderr


def _findings(env: dict[str, str], address: str) -> str:
    r = subprocess.run([*CLI, "--target", address, "--no-discovery"], capture_output=True,
                       text=True, timeout=60, env=env, cwd=ROOT)
    return r.stdout + r.stderr


@pytest.mark.slow
def test_install_before_jax_hooks_jax_when_imported(tmp_path):
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", JAX_LATE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        before = json.loads(proc.stdout.readline())
        # Waiting, and saying so everywhere, never "No problems found".
        assert before["engine"] == "" and "jax" in before["waiting"].split(",")
        assert "no engine imported yet: the hook waits for jax" in before["report"]
        record = _record(env)
        assert record["engine"] == "" and "jax" in record["waiting"]
        doctor = _doctor(env, before["address"])
        assert "no engine imported yet: the hook waits for jax" in doctor, doctor
        table = _findings(env, before["address"])
        assert "No problems found" not in table and "no engine imported yet" in table, table
        doc = json.loads(subprocess.run(
            [*CLI, "--target", before["address"], "--no-discovery", "--json"],
            capture_output=True, text=True, timeout=60, env=env, cwd=ROOT).stdout)
        (target,) = [t for t in doc["targets"] if t["process"]]
        assert "jax" in target["process"]["waiting"], target["process"]

        proc.stdin.write("\n")
        proc.stdin.flush()
        after = json.loads(proc.stdout.readline())
        assert after["engine"] == "jax" and "jax" not in after["waiting"].split(",")
        assert after["compiles"] == 2
        assert any("argument 'x' changed f32[3] -> f32[4]" in c for c in after["causes"]), after
        record = _record(env)  # rewritten once jax was hooked
        assert record["engine"] == "jax" and "jax" not in record["waiting"]
        doctor = _doctor(env, after["address"])
        assert "hooked jax" in doctor and "no engine imported yet" not in doctor, doctor
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read() if proc.stderr else ""
        assert "jax before import: False" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_install_before_torch_hooks_torch_compile_when_imported(tmp_path):
    r = subprocess.run([sys.executable, "-c", TORCH_LATE], capture_output=True, text=True,
                       timeout=120, env=_env(tmp_path), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["engine"] == "torch_compile", out
    assert out["compiles"] == 2, out
    assert any("size mismatch at index 0. expected 3, actual 4" in c for c in out["causes"]), out


@pytest.mark.slow
def test_no_engine_ever_imported_says_so_in_the_report(tmp_path):
    code = ("import metrics\nmetrics.install(serve=False)\n"
            "print(getattr(metrics, 'waiting_engines', list)())\nprint(metrics.metrics_report())\n"
            "import sys\nassert 'jax' not in sys.modules and 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=_env(tmp_path), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "'jax'" in r.stdout and "'torch_compile'" in r.stdout
    assert "no engine imported yet: the hook waits for jax" in r.stdout
    assert "metrics.install(engines=[...])" in r.stdout
    assert r.stderr == ""


# The post-import hook itself (metrics.engines.importwatch), on real modules in a temp dir.

@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Writes modules into a fresh directory on sys.path; forgets them after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_callback_runs_after_the_body_and_the_finder_leaves(modules):
    from metrics.engines import importwatch

    name = modules("late_engine_a", "import builtins\nVALUE = 41 + 1\n")
    seen = []
    assert not importwatch.when_imported(name, lambda: seen.append(sys.modules[name].VALUE))
    assert name in importwatch.waiting() and seen == []
    __import__(name)
    assert seen == [42]  # the whole body had run
    assert name not in importwatch.waiting()
    if not importwatch.waiting():
        assert not any(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path)
    # Already imported: runs at once.
    assert importwatch.when_imported(name, lambda: seen.append("now"))
    assert seen == [42, "now"]


def test_a_failing_callback_never_breaks_the_import(modules, monkeypatch):
    from metrics.engines import importwatch

    errors = []
    monkeypatch.setattr(importwatch, "on_error", lambda n, e: errors.append((n, str(e))))
    name = modules("late_engine_b", "X = 1\n")

    def boom() -> None:
        raise RuntimeError("hook broke")

    importwatch.when_imported(name, boom)
    assert __import__(name).X == 1
    assert errors == [(name, "hook broke")]


def test_a_module_that_fails_to_import_fires_nothing_and_keeps_waiting(modules):
    from metrics.engines import importwatch

    name = modules("late_engine_c", "raise ImportError('not here')\n")
    seen = []
    importwatch.when_imported(name, lambda: seen.append(1))
    with pytest.raises(ImportError):
        __import__(name)
    assert seen == [] and name in importwatch.waiting()
    importwatch.cancel(name)
    assert name not in importwatch.waiting()


def test_threads_importing_at_once_fire_each_callback_once(modules):
    import threading

    from metrics.engines import importwatch

    names = [modules(f"late_engine_t{i}", "import time\ntime.sleep(0.01)\n") for i in range(8)]
    fired: list[str] = []
    for n in names:
        importwatch.when_imported(n, lambda n=n: fired.append(n))
    threads = [threading.Thread(target=__import__, args=(n,)) for n in names for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(fired) == sorted(names)


@pytest.mark.slow
def test_tpu_info_run_shares_the_watcher_and_hooks_an_engine_imported_later(tmp_path):
    from tests.system.test_run import run_in

    code = textwrap.dedent("""
        import sys
        import jax, jax.numpy as jnp
        import metrics, metrics.engines.importwatch
        print("shared:", sys.modules["metrics.engines.importwatch"] is metrics.engines.importwatch)
        print("waiting:", "torch_compile" in metrics.waiting_engines())
        import torch
        torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
        print("engines:", sorted(e.name for e in metrics.installed_engines()))
        print("torch compiles:", sum(g.compiles for g in metrics.snapshot().graphs
                                     if g.engine == "torch_compile"))
    """)
    rc, out, err = run_in(tmp_path, code)
    assert rc == 0, err
    assert "shared: True" in out and "waiting: True" in out
    assert "engines: ['jax', 'torch_compile']" in out
    assert "torch compiles: 1" in out, out


@pytest.mark.slow
def test_a_fork_while_another_thread_holds_the_watchers_lock_does_not_hang(tmp_path):
    (tmp_path / "late_engine_f.py").write_text("X = 1\n")
    code = textwrap.dedent(f"""
        import os, sys, threading, time
        sys.path.insert(0, {str(tmp_path)!r})
        from metrics.engines import importwatch
        held, done = threading.Event(), threading.Event()
        def hold():
            with importwatch._lock:
                held.set()
                done.wait()
        threading.Thread(target=hold, daemon=True).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            seen = []
            importwatch.when_imported("late_engine_f", lambda: seen.append(1))
            import late_engine_f
            os._exit(0 if seen == [1] else 3)
        done.set()
        for _ in range(200):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                sys.exit(os.waitstatus_to_exitcode(status))
            time.sleep(0.05)
        os.kill(pid, 9)
        sys.exit(4)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=_env(tmp_path), cwd=ROOT)
    assert r.returncode == 0, (r.returncode, r.stderr)


@pytest.mark.slow
def test_an_engine_import_never_waits_long_for_a_busy_install(tmp_path):
    # Another thread holds install()'s lock (as one loading the same engine
    # would): jax's import goes on, and the hook is retried at mark_step().
    code = textwrap.dedent("""
        import threading, time
        import metrics
        metrics.install(serve=False)
        metrics._LOCK_WAIT_S = 0.2
        held, release = threading.Event(), threading.Event()
        def busy():
            with metrics._lock:
                held.set()
                release.wait()
        t = threading.Thread(target=busy)
        t.start()
        held.wait()
        t0 = time.monotonic()
        import jax
        waited = time.monotonic() - t0
        print("during:", list(metrics._installed), waited < 30)
        release.set()
        t.join()
        metrics.mark_step()
        print("after:", [e.name for e in metrics.installed_engines()],
              "jax" in metrics.waiting_engines())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=_env(tmp_path), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "during: [] True" in r.stdout and "after: ['jax'] False" in r.stdout, r.stdout


@pytest.mark.slow
def test_tpu_info_run_hooks_jax_before_the_programs_first_line_after_import(tmp_path):
    """The engine is hooked while its import finishes (its module still marked
    initializing by importlib), so functions jitted at module level right after
    ``import jax`` are counted: executions and the inferred step."""
    from tests.system.test_run import run_in

    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        import metrics
        print("hooked at import:", [e.name for e in metrics.installed_engines()])

        @jax.jit
        def step(x):
            return x * 2 + 1

        x = jnp.ones(4)
        for _ in range(12):
            x = step(x)
        s = metrics.snapshot()
        print("steps:", s.steps.count if s.steps else None, s.steps.source if s.steps else None)
    """)
    rc, out, err = run_in(tmp_path, code)
    assert rc == 0, err
    assert "hooked at import: ['jax']" in out, out
    assert "steps: 12 inferred" in out, out
