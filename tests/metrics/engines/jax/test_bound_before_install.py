"""``from jax import jit`` above ``metrics.install()``: the program's own name
for JAX's real ``jit`` is named, with the line that bound it, as the blind
spot that hides its steps (in the snapshot, in ``doctor``'s steps line and
first among what is not counted), not the generic "never called
metrics.mark_step()"; a library's own alias is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from metrics.engines._frames import LibraryFrames, skip_prefixes
from metrics.engines.jax import bound as jax_bound

ROOT = Path(__file__).resolve().parents[4]

PROGRAM = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import jax.numpy as jnp
from jax import jit, grad  # BOUND
import libmod  # an installed library that binds jit too: not the user's to fix
import metrics
metrics.install(engines=["jax"], port=0)

@jit
def step(w, x):
    return w - 0.1 * grad(lambda w: ((w * x) ** 2).sum())(w)

w = jnp.ones(8)
for i in range(30):
    w = step(w, jnp.ones(8) * i)
w.block_until_ready()
s = metrics.snapshot()
print(json.dumps({"port": metrics.exporter().port, "blind": list(s.blind_spots),
                  "steps": s.steps is not None}), flush=True)
sys.stdin.read()
'''


@pytest.fixture(scope="module")
def bound_program(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("jax")
    tmp = tmp_path_factory.mktemp("bound")
    site = tmp / "target"  # installed as pip --target installs: a .dist-info lists it
    (site / "libmod-0.1.dist-info").mkdir(parents=True)
    (site / "libmod-0.1.dist-info" / "RECORD").write_text(
        "libmod.py,,\nlibmod-0.1.dist-info/RECORD,,\n")
    (site / "libmod.py").write_text("from jax import jit\n")
    (tmp / "train.py").write_text(PROGRAM)
    line = next(n for n, t in enumerate(PROGRAM.splitlines(), 1) if "# BOUND" in t)
    env = {k: v for k, v in os.environ.items() if k != "TPU_INFO_USER_PATHS"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", TPU_INFO_RUNTIME_DIR=str(tmp / "rt"),
               COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "train.py", str(site)], cwd=tmp, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        assert first, proc.stderr.read() if proc.stderr else ""
        got = json.loads(first)
        doctor = subprocess.run([sys.executable, "-m", "tpu_info", "--target",
                                 f"127.0.0.1:{got['port']}", "doctor"], capture_output=True,
                                text=True, timeout=120, env=env, cwd=tmp)
    finally:
        proc.kill()
        proc.wait()
    return got, doctor.stdout, f"train.py:{line}"


@pytest.mark.slow
def test_the_snapshot_names_the_bound_name_and_its_line_first(bound_program):
    got, _, where = bound_program
    assert not got["steps"]  # the loop's calls went through JAX's own jit: none counted
    assert got["blind"][0] == (
        f"`jit` was bound from jax before metrics.install() at {where} (from jax import jit): "
        "its functions are not counted; call metrics.install() above that import, or run "
        "under `tpu-info run`"), got["blind"]
    assert not any("libmod" in b for b in got["blind"])
    assert not any("reached through a name bound before install" in b for b in got["blind"])


@pytest.mark.slow
def test_doctor_blames_the_bound_name_not_a_missing_mark_step(bound_program):
    _, doctor, where = bound_program
    steps = [ln for ln in doctor.splitlines() if "/steps:" in ln]
    assert len(steps) == 1 and f"`jit` was bound from jax before metrics.install() at {where}" \
        in steps[0], doctor
    assert "mark_step" not in steps[0]
    assert f"not counted: `jit` was bound from jax before metrics.install() at {where}" in doctor


def _module(tmp_path: Path, text: str):
    import importlib.util

    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location("prog_bound_test", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m, path


def test_aliases_and_assignments_are_found_with_their_statement(tmp_path, monkeypatch):
    jax = pytest.importorskip("jax")
    m, path = _module(tmp_path, """
        import jax
        from jax import pmap as P, numpy
        J = jax.jit
        later = 1
    """)
    monkeypatch.setitem(sys.modules, m.__name__, m)
    frames = LibraryFrames(skip_prefixes(jax), user_paths=())
    originals = {"jit": jax.jit, "pmap": jax.pmap}
    got = [b for b in jax_bound.bound_names(originals, frames) if b.module == m.__name__]
    assert sorted((b.name, b.what) for b in got) == [("J", "jit"), ("P", "pmap")]
    assert jax_bound.statement(str(path), "P", "pmap") == (3, "from jax import pmap as P")
    assert jax_bound.statement(str(path), "J", "jit") == (4, "J = jax.jit")
    sentence = jax_bound.sentence(next(b for b in got if b.name == "J"))
    assert "prog.py:4 (J = jax.jit)" in sentence and sentence.startswith("`J` was bound")


def test_module_globals_are_read_while_the_program_adds_to_them() -> None:
    # The scrape thread reads the user's module globals while the program's loop
    # creates new ones: a copy that meets a change is read again, never raised.
    import threading

    from metrics.engines.jax.bound import _items

    space: dict[str, object] = {}
    stop = threading.Event()

    def grow() -> None:
        i = 0
        while not stop.is_set():
            space[f"v{i % 500}"] = i  # grows to 500 names, then starts over
            i += 1
            if i % 500 == 0:
                space.clear()

    t = threading.Thread(target=grow)
    t.start()
    try:
        for _ in range(500):
            _items(space)
    finally:
        stop.set()
        t.join()
