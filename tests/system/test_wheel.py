"""The built wheel, installed alone into a fresh venv (its dependencies from
the package index, no torch, no jax, no numpy), works as a user gets it:
``tpu-info`` with nothing to show, ``tpu-info run``'s start-up hook, a
pure-Python hooked program (``import metrics``, no engine) that ``tpu-info``,
``tpu-info report`` and ``tpu-info --watch`` (in tmux) read, and ``mypy
--strict`` on a typed script, which sees the package only through its
``py.typed``. The torch_xla venv (``make xla-env``) resolves our
``[torch]`` extra without touching its torch.

Nothing here runs from the source tree: every command's working directory is
a temporary one and ``PYTHONPATH`` is unset.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT
from tests.system.test_typing import GOOD, have_mypy, mypy_errors
from tpu_info import __version__

DIST = "xla-tpu-info"
PACKAGES = ("tpu_info", "metrics", "profiler", "tui")
XLA_ENV = Path(ROOT) / "tools" / "xla-env.sh"

HOOKED = r"""
import sys, metrics
metrics.install(engines=[])         # no engine: a pure-Python program
@metrics.track
def step(x: int) -> int:
    return x + 1
for i in range(3):
    step(i)
    metrics.mark_step()
print(metrics.exporter().address, flush=True)
sys.stdin.read()
"""


def _clean_env(runtime_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TPU_INFO_RUNTIME_DIR=str(runtime_dir), TPU_INFO_PORT="0", COLUMNS="160")
    return env


def _setuptools_ok() -> bool:
    """The running interpreter can build without an isolated build env."""
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0]) >= 77
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


def build_wheel(workdir: Path) -> Path:
    """Builds the wheel from a copy of what it ships (the source tree stays clean)."""
    src = workdir / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(Path(ROOT) / name, src / name)
    for package in PACKAGES:
        shutil.copytree(Path(ROOT) / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    isolation = ["--no-build-isolation"] if _setuptools_ok() else []  # else pip fetches it
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        *isolation, "-w", str(workdir / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300, cwd=workdir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = (workdir / "dist").glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv's bin dir, a scratch dir): the wheel alone in a fresh venv."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work)
    venv = work / "venv"
    # The venv has no pip of its own (faster): this interpreter's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120, env=_clean_env(work / "rt"))
    py = venv / "bin" / "python"
    # No PYTHONPATH: a source tree on it (with an editable install's egg-info)
    # would look to pip like the package is already there.
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet",
                        str(wheel)], capture_output=True, text=True, timeout=600, cwd=work,
                       env=_clean_env(work / "rt"))
    if r.returncode and "Could not find a version" in r.stderr + r.stdout:
        msg = f"the package index is not reachable: {r.stderr.strip()[-400:]}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    scratch = work / "run"
    scratch.mkdir()
    return wheel, venv / "bin", scratch


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120,
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env, input=stdin)


def test_distribution_metadata():
    """Our own name (Google's is ``tpu-info``), the extras users ask for, and a
    ``[torch]`` that can never make pip replace an installed torch."""
    project = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST and project["scripts"] == {
        "tpu-info": "tpu_info.commands.cli:run"}
    extras = project["optional-dependencies"]
    assert {"jax", "tpu", "nvidia", "torch"} <= extras.keys()
    assert any(r.startswith("jax[tpu]") for r in extras["tpu"])
    assert any(r.startswith("nvidia-ml-py") for r in extras["nvidia"])
    names = {canonicalize_name(Requirement(r).name) for r in extras["torch"]}
    assert not names & {"torch", "torch-xla"}, extras["torch"]


def test_track_without_numpy():
    """``metrics.track`` of a plain function needs no numpy (jax brings it; a
    program without jax, like the hooked one below, has none)."""
    code = ("import sys; sys.modules['numpy'] = None\n"
            "import metrics\n"
            "f = metrics.track(lambda x: x + 1)\n"
            "print(f(1), metrics.counter_value('ExecuteTime') is None)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert r.returncode == 0 and r.stdout.split()[0] == "2", r.stdout + r.stderr


@pytest.mark.slow
def test_wheel_alone_in_a_fresh_venv(installed, tmp_path):
    wheel, bin_dir, scratch = installed
    assert wheel.name.startswith("xla_tpu_info-"), wheel.name
    env = _clean_env(tmp_path / "rt")
    py = str(bin_dir / "python")
    probe = ("import importlib.metadata as m, importlib.util as u, tpu_info, metrics\n"
             "print(m.version('xla-tpu-info'), tpu_info.__version__)\n"
             "print(m.entry_points(group='console_scripts')['tpu-info'].value)\n"
             "print([n for n in ('torch', 'jax', 'numpy') if u.find_spec(n)])\n"
             "print(tpu_info.__file__)\n"
             "from pathlib import Path\n"
             "print([p for p in ('tpu_info', 'metrics', 'profiler', 'tui')\n"
             "       if not (Path(u.find_spec(p).origin).parent / 'py.typed').is_file()])\n"
             "try:\n    m.distribution('tpu-info')\nexcept m.PackageNotFoundError:\n"
             "    print('no tpu-info')\n")
    r = _run([py, "-c", probe], scratch, env)
    assert r.returncode == 0, r.stderr
    version, script, engines, where, untyped, google = r.stdout.splitlines()
    assert version == f"{__version__} {__version__}"
    assert script == "tpu_info.commands.cli:run"
    assert engines == "[]"  # installed alone: no engine came with it
    assert where.startswith(str(bin_dir.parent)), where  # from the venv, not the tree
    assert untyped == "[]" and google == "no tpu-info"

    tpu_info = str(bin_dir / "tpu-info")
    r = _run([tpu_info, "-v"], scratch, env)
    assert r.returncode == 0 and __version__ in r.stdout.splitlines()[0], r.stdout + r.stderr
    # Nothing to read: one line that says what to do next, exit 0.
    r = _run([tpu_info], scratch, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no hooked process found" in r.stdout and "Traceback" not in r.stderr

    # `tpu-info run` finds its start-up hook inside the installed profiler
    # package: the post-import watch is loaded, metrics itself is not (no engine).
    watch = ("import sys; m = sys.modules\n"
             "print('metrics.engines.importwatch' in m, 'metrics' in m)")
    r = _run([tpu_info, "run", "--", py, "-c", watch], scratch, env)
    assert r.returncode == 0 and r.stdout.split() == ["True", "False"], r.stdout + r.stderr

    prog = subprocess.Popen([py, "-c", HOOKED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=scratch)
    try:
        assert prog.stdout is not None
        address = prog.stdout.readline().strip()
        assert address, prog.communicate()[1]
        r = _run([tpu_info], scratch, env, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        row = next((line for line in r.stdout.splitlines() if line.split()[:1] ==
                    [str(prog.pid)]), None)
        assert row is not None, r.stdout
        r = _run([tpu_info, "report", "--pid", str(prog.pid)], scratch, env, timeout=60)
        assert r.returncode == 0 and "MarkStep" in r.stdout, r.stdout + r.stderr
        _watch_starts(bin_dir, scratch, env, address)
    finally:
        prog.kill()
        prog.communicate(timeout=30)


def _watch_starts(bin_dir: Path, scratch: Path, env: dict[str, str], address: str) -> None:
    """``tpu-info --watch`` from the venv: its app imports and, in a real
    terminal (tmux), reads the hooked program live and quits on ``q`` with 0."""
    r = _run([str(bin_dir / "python"), "-c", "import tui.app"], scratch, env)
    assert r.returncode == 0, r.stderr
    from tests.tui.test_tui_tmux import Pane, _ensure_tmux

    tmux = _ensure_tmux()
    rc_file = scratch / "watch.rc"
    script = scratch / "watch.sh"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()
                      if k in ("TPU_INFO_RUNTIME_DIR", "TPU_INFO_PORT", "PATH", "HOME"))
    script.write_text(f"unset PYTHONPATH VIRTUAL_ENV\n{exports}cd {shlex.quote(str(scratch))}\n"
                      f"{shlex.quote(str(bin_dir / 'tpu-info'))} --watch --rate 0.5\n"
                      f"echo $? > {shlex.quote(str(rc_file))}\nsleep 60\n")
    pane = Pane(tmux, f"sh {shlex.quote(str(script))}")
    try:
        pane.wait_for(lambda t: f"{address} live" in t, timeout=60)
        pane.keys("q")
        end = time.monotonic() + 30
        while not rc_file.exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert rc_file.exists(), pane.text()
        assert rc_file.read_text().strip() == "0"
    finally:
        pane.close()


@pytest.mark.slow
def test_typed_script_against_the_installed_wheel(installed, tmp_path):
    """mypy finds the installed packages only because they carry py.typed."""
    have_mypy()
    _, bin_dir, _ = installed
    script = tmp_path / "user.py"
    shutil.copy(GOOD, script)
    found, out = mypy_errors([script], tmp_path, python=str(bin_dir / "python"))
    assert found == set(), out
    assert "py.typed" not in out and "missing library stubs" not in out, out


@pytest.mark.slow
def test_torch_extra_leaves_torch_xla_venv_alone(installed):
    """pip's resolver in the torch_xla 2.9 venv: ``[torch]`` adds only us
    (on 219d16f, ``torch>=2.13`` brought torch 2.14.1 and 20 CUDA wheels).
    ``--dry-run`` changes nothing in that venv."""
    wheel, _, scratch = installed
    r = subprocess.run(["bash", str(XLA_ENV), "--path"], capture_output=True, text=True,
                       timeout=60)
    xla_python = r.stdout.strip()
    if not xla_python or not Path(xla_python).exists():
        pytest.skip("no torch_xla venv (make xla-env builds it)")
    if importlib.util.find_spec("pip") is None:
        pytest.skip("no pip")
    report = scratch / "resolve.json"
    # As installed, and as upgraded with every dependency (the most pip may move).
    for upgrade in ([], ["--upgrade", "--upgrade-strategy", "eager"]):
        r = subprocess.run([xla_python, "-m", "pip", "install", "--dry-run", "--quiet", *upgrade,
                            "--report", str(report), f"{DIST}[torch] @ {wheel.as_uri()}"],
                           capture_output=True, text=True, timeout=300, cwd=scratch,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        would = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
        assert DIST in would and not [n for n in would if n.startswith(
            ("torch", "nvidia", "cuda", "triton"))], (upgrade, would)
        if not upgrade:
            assert would == [DIST], would
