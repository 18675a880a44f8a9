"""``tpu-info run``: unmodified programs in real subprocesses get the hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpu_info.commands import run

ROOT = Path(__file__).resolve().parents[2]

JAX_PROGRAM = textwrap.dedent("""
    import sys
    print("metrics before jax:", "metrics" in sys.modules, flush=True)
    import jax, jax.numpy as jnp
    jax.jit(lambda x: x * 2 + 1)(jnp.ones(4)).block_until_ready()
    import metrics  # only to read what the hook recorded
    print("engines:", [e.name for e in metrics.installed_engines()])
    print("compiles:", metrics.counter_value("UncachedCompile"))
    sys.exit(int(sys.argv[1]))
""")


def run_in(tmp_path: Path, code: str, *args: str, **kw) -> tuple[int, str, str]:
    """run_hooked on ``code`` with stdout/stderr captured to files."""
    script = tmp_path / "prog.py"
    script.write_text(code)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    saved = os.dup(1), os.dup(2)
    with open(out, "wb") as o, open(err, "wb") as e:
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
        try:
            rc = run.run_hooked([sys.executable, str(script), *args], **kw)
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return rc, out.read_text(), err.read_text()


def test_autoinstall_dir_found_without_importing_metrics():
    code = ("import sys; from tpu_info.commands.run import autoinstall_dir; d = autoinstall_dir(); "
            "assert (d / 'sitecustomize.py').is_file(), d; "
            "assert 'metrics' not in sys.modules and 'jax' not in sys.modules; print(d)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    assert Path(out) == ROOT / "profiler" / "_autoinstall"


def test_hooked_env_puts_bootstrap_first():
    d = Path("/opt/hook")
    env = run.hooked_env({"PYTHONPATH": f"/a{os.pathsep}/opt/hook", "X": "1"}, d)
    assert env["PYTHONPATH"] == f"/opt/hook{os.pathsep}/a"
    assert env["TPU_INFO_AUTOINSTALL"] == "1" and env["X"] == "1"
    assert run.hooked_env({}, d)["PYTHONPATH"] == "/opt/hook"


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_unmodified_jax_program_is_hooked_and_exit_code_passes_through(tmp_path, code):
    rc, out, err = run_in(tmp_path, JAX_PROGRAM, str(code))
    assert rc == code, err
    assert "metrics before jax: False" in out  # nothing loaded until jax was imported
    assert "engines: ['jax']" in out
    compiles = int(out.split("compiles:")[1].split()[0])
    assert compiles >= 1
    assert err == ""


def test_program_without_an_engine_never_loads_metrics(tmp_path):
    rc, out, err = run_in(tmp_path, "import sys\nprint(sorted(m for m in ('metrics', 'jax') "
                          "if m in sys.modules))\nsys.exit(3)\n")
    assert (rc, out.strip(), err) == (3, "[]", "")


def test_chains_to_the_next_sitecustomize(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_WAS_HERE = 1\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    rc, out, err = run_in(tmp_path, "import builtins\nprint(builtins.SITE_WAS_HERE)\n",
                          environ=env)
    assert (rc, out.strip(), err) == (0, "1", "")


def test_a_broken_sitecustomize_or_hook_never_breaks_the_program(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise RuntimeError('site is broken')\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    rc, out, err = run_in(tmp_path, "print('ran')\n", environ=env)
    assert (rc, out.strip()) == (0, "ran")
    assert "site is broken" in err


@pytest.mark.slow
def test_programs_own_metrics_module_is_not_shadowed(tmp_path):
    (tmp_path / "metrics.py").write_text("MINE = True\n")
    code = "import jax\nimport metrics\nprint('mine:', metrics.MINE)\n"
    rc, out, err = run_in(tmp_path, code, cwd=tmp_path)
    assert (rc, out.strip()) == (0, "mine: True")
    assert "not installing" in err and err.count("\n") == 1


def test_command_not_found_is_127(capfd):
    assert run.run_hooked(["/nonexistent/python-xyz"]) == 127
    assert "command not found" in capfd.readouterr().err
    with pytest.raises(ValueError):
        run.run_hooked([])


def test_killed_by_signal_is_128_plus_n(tmp_path):
    rc, _, _ = run_in(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert rc == 128 + signal.SIGKILL


CHILD_WAITING_FOR_SIGNAL = textwrap.dedent("""
    import signal, sys, time
    def on_term(signum, frame):
        sys.exit(7)
    def on_int(signum, frame):  # explicit: the inherited SIGINT disposition varies
        sys.exit(5)             # (make, timeout and CI runners change it)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_int)
    print("ready", flush=True)
    time.sleep(60)
    sys.exit(1)
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig, expected", [(signal.SIGTERM, 7), (signal.SIGINT, 5)])
def test_signals_are_forwarded_to_the_child(tmp_path, sig, expected):
    script = tmp_path / "child.py"
    script.write_text(CHILD_WAITING_FOR_SIGNAL)
    parent_code = (f"import sys; from tpu_info.commands.run import run_hooked; "
                   f"sys.exit(run_hooked([sys.executable, {str(script)!r}]))")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=ROOT,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"  # the child printed it
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == expected
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_python_dash_m_tpu_info_is_the_command():
    """``python -m tpu_info`` works where the console script is missing (an
    engine's own venv) and imports neither torch nor jax."""
    r = subprocess.run([sys.executable, "-m", "tpu_info", "run", "--", sys.executable, "-c",
                        "import sys; print('torch' in sys.modules or 'jax' in sys.modules)"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
