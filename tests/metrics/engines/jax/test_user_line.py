"""The user's line, not the library's: a program that reaches JAX through an
installed library (the shape of Flax NNX's ``nnx.jit`` and ``nnx.Linear``: ``via mylib nn.Linear``)
has its syncs, transfers, compiles and recompile causes at the line of its
own that called the library, with the library call named (``via``);
``TPU_INFO_USER_PATHS`` makes an installed package the user's own.

A real package installed by pip into a ``--target`` directory on
``PYTHONPATH`` (no ``site-packages`` in its path: flax on the TPU machine
was installed that way, and its ``compilation.py`` took the findings'
lines) and a real script calling it, run in a fresh interpreter with the
hook installed: the import system, not the directory's name, says the
package is a library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[4]

LIBRARY = {
    "__init__.py": '''
        import jax
        import jax.numpy as jnp

        from mylib.nn.linear import Linear  # noqa: F401


        def jit(fun):  # like nnx.jit: the library calls jax.jit for the user
            jitted = jax.jit(fun)

            def wrapper(*args):
                return jitted(*args)  # LIB(step)

            return wrapper


        def read(x):
            return float(x)  # LIB(read)


        def to_device(a):
            return jnp.asarray(a)  # LIB(put)
    ''',
    "nn/__init__.py": "",
    "nn/linear.py": '''
        import jax.numpy as jnp


        class Linear:  # like nnx.Linear: eager ops run inside the library
            def __init__(self, n):
                self.w = jnp.ones((n, n))

            def __call__(self, x):
                return jnp.tanh(x @ self.w)  # LIB(layer)
    ''',
}

SCRIPT = '''
import json, sys
import metrics
metrics.install(engines=["jax"], serve=False)
import jax.numpy as jnp
import numpy as np
import mylib

step = mylib.jit(lambda x: x * 2.0)
x = jnp.ones(4)
for i in range(5):
    y = step(x)  # USER(step)
    mylib.read(y.sum())  # USER(read)
    mylib.to_device(np.ones(8, np.float32))  # USER(put)
step(jnp.ones(5))  # USER(recompile)
layer = mylib.Linear(4)
layer(x)  # USER(layer)
s = metrics.snapshot()
print(json.dumps({
    "sites": [[t.kind, t.location, t.via] for t in s.sites],
    "compiles": [[e.name, e.location, e.via] for e in s.events
                 if e.kind in ("compile", "recompile")],
    "causes": [[g.name, c.description, c.location, c.via] for g in s.graphs
               for c in g.causes],
}))
'''


def _marks(path: Path, tag: str) -> dict[str, str]:
    """``name -> path:line`` of the ``# TAG(name)`` markers in ``path``."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if f"# {tag}(" in line:
            out[line.rsplit(f"# {tag}(", 1)[1].rstrip(")")] = f"{path}:{n}"
    return out


PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "mylib"
version = "0.1"

[tool.setuptools]
packages = ["mylib", "mylib.nn"]
"""


def _install(tmp_path: Path) -> Path:
    """``pip install --target`` of the library built from source here (no
    network): the directory pip wrote, with mylib and its ``.dist-info``."""
    src = tmp_path / "src"
    for name, text in LIBRARY.items():
        (src / "mylib" / name).parent.mkdir(parents=True, exist_ok=True)
        (src / "mylib" / name).write_text(textwrap.dedent(text))
    (src / "pyproject.toml").write_text(PYPROJECT)
    target = tmp_path / "lib" / "target"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-build-isolation", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "site-packages" not in str(target) and list(target.glob("mylib-*.dist-info"))
    return target


def _run(tmp_path: Path, user_paths: str | None) -> tuple[dict, dict[str, str], dict[str, str]]:
    site = _install(tmp_path)
    script = tmp_path / "work" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TPU_INFO_USER_PATHS"}
    env.update(PYTHONPATH=os.pathsep.join((str(ROOT), str(site))), JAX_PLATFORMS="cpu")
    if user_paths is not None:
        env["TPU_INFO_USER_PATHS"] = user_paths.format(site=site)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=180, env=env, cwd=script.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lib = {**_marks(site / "mylib" / "__init__.py", "LIB"),
           **_marks(site / "mylib" / "nn" / "linear.py", "LIB")}
    return json.loads(proc.stdout.splitlines()[-1]), _marks(script, "USER"), lib, site


@pytest.fixture(scope="module")
def library_user(tmp_path_factory: pytest.TempPathFactory):
    return _run(tmp_path_factory.mktemp("plain"), None)


@pytest.fixture(scope="module")
def own_library(tmp_path_factory: pytest.TempPathFactory):
    return _run(tmp_path_factory.mktemp("own"), f"/nowhere{os.pathsep}{{site}}")


@pytest.mark.slow
def test_a_sync_inside_a_library_is_at_the_users_line_via_the_library(library_user):
    got, user, _, _ = library_user
    assert ["sync", user["read"], "mylib read"] in got["sites"], got["sites"]


@pytest.mark.slow
def test_a_transfer_inside_a_library_is_at_the_users_line(library_user):
    got, user, _, _ = library_user
    assert ["implicit_to_device", user["put"], "mylib to_device"] in got["sites"], got["sites"]


@pytest.mark.slow
def test_a_compile_through_a_library_jit_is_at_the_users_call(library_user):
    got, user, _, _ = library_user
    assert ["jit(<lambda>)", user["step"], "mylib jit"] in got["compiles"], got["compiles"]


@pytest.mark.slow
def test_eager_ops_inside_a_library_layer_are_at_the_users_call(library_user):
    got, user, _, _ = library_user
    at_layer = [c for c in got["compiles"] if c[1] == user["layer"]]
    assert at_layer and all(c[2] == "mylib nn.Linear" for c in at_layer), got["compiles"]


@pytest.mark.slow
def test_a_recompile_cause_is_at_the_users_call_via_the_library(library_user):
    got, user, _, _ = library_user
    causes = [c for c in got["causes"] if c[0] == "jit(<lambda>)" and "changed" in c[1]]
    assert causes and causes[0][2:] == [user["recompile"], "mylib jit"], got["causes"]


@pytest.mark.slow
def test_no_line_points_into_the_library(library_user):
    got, _, _, target = library_user
    lines = [s[1] for s in got["sites"]] + [c[1] for c in got["compiles"]] + [
        c[2] for c in got["causes"]]
    assert lines and not [x for x in lines if x and x.startswith(str(target))], lines


@pytest.mark.slow
def test_user_paths_make_an_installed_package_the_users_own(own_library):
    got, _, lib, _ = own_library
    assert ["sync", lib["read"], ""] in got["sites"], got["sites"]
    assert ["implicit_to_device", lib["put"], ""] in got["sites"], got["sites"]
    assert ["jit(<lambda>)", lib["step"], ""] in got["compiles"], got["compiles"]
    assert any(c[1:] == [lib["layer"], ""] for c in got["compiles"]), got["compiles"]
    causes = [c for c in got["causes"] if c[0] == "jit(<lambda>)" and "changed" in c[1]]
    assert causes and causes[0][2:] == [lib["step"], ""], got["causes"]
