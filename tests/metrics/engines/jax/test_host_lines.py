"""The training thread's own host work between steps, at the user's line
(issue 41's nnx_lifted: flax's ``dataset()`` generator drew each batch with
``np.random.choice`` and numpy indexing, 23-29% of the step by A/B against
batches made before the loop, and the tool read it as "other"). Real JAX
on the CPU: a generator that makes each batch in a Python loop over rows
of numpy work, the program's own timer around it; said where the loop is
host-bound, not where the device's steps are long enough to hide it (a
callback in the step that sleeps: device time that takes no core from the
host, on a 2-core machine shared with other work)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

from tests.hooked import PRINT_SNAPSHOT  # noqa: E402
from tpu_info.contract.model import Snapshot  # noqa: E402
from tpu_info.views.findings import find  # noqa: E402
from tpu_info.views.host_work import not_raised  # noqa: E402

PROGRAM = textwrap.dedent('''
    import json, time
    import numpy as np
    import jax, jax.numpy as jnp
    import metrics
    metrics.install(engines=["jax"])

    DATA = np.random.rand(2000, 4096).astype(np.float32)
    SIZE = {size}
    WORK = {work}

    def batches(rng):
        while True:
            rows = []
            for i in range(32):
                row = DATA[rng.integers(0, len(DATA))]
                for _ in range(WORK):
                    row = np.tanh(row) * 0.5 + np.sqrt(np.abs(row))
                rows.append(row)
            yield np.stack(rows)

    def device_work():  # the device busy SLEEP s a step, no CPU taken from the host
        time.sleep({sleep})
        return np.float32(0.0)

    @jax.jit
    def step(w, x):
        h = jnp.tanh(x[:, :SIZE] @ w)
        for _ in range({layers}):
            h = jnp.tanh(h @ w)
        if {sleep}:
            h = h + jax.pure_callback(device_work, jax.ShapeDtypeStruct((), jnp.float32))
        return w - 1e-4 * jnp.mean(h) * jnp.ones_like(w)

    w = jnp.eye(SIZE, dtype=jnp.float32)
    it = batches(np.random.default_rng(0))
    made = []
    t_loop = time.perf_counter()
    for i in range({steps}):
        t0 = time.perf_counter()
        x = next(it)
        made.append(time.perf_counter() - t0)
        w = step(w, x)
    w.block_until_ready()
    print(json.dumps({{"made": sorted(made)[len(made) // 2]}}))
''')


def _snapshot_and_timer(tmp_path: Path, size: int, layers: int, steps: int,
                        work: int = 1, sleep: float = 0.0) -> tuple[Snapshot, float]:
    """The snapshot the program printed, and its own median time per batch."""
    import json
    import subprocess
    import sys

    from tests.hooked import ROOT
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM.format(size=size, layers=layers, steps=steps, work=work,
                                   sleep=sleep) + PRINT_SNAPSHOT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(prog)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(
        json.loads(lines[-1])["proto"])))
    return s, json.loads(lines[-2])["made"]


def test_a_generators_numpy_rows_are_said_at_its_line_at_about_the_programs_own_time(
        tmp_path: Path) -> None:
    s, made = _snapshot_and_timer(tmp_path, size=64, layers=0, steps=2500)
    [f] = [f for f in find(s) if f.kind == "per_step_host_work"]
    src = PROGRAM.splitlines()
    line = int((f.location or ":0").rsplit(":", 1)[1])
    assert f.location and f.location.endswith(f"prog.py:{line}")
    assert src[line - 1].strip().startswith(("row = ", "rows.append", "yield", "for i in"))
    assert "batches(), a generator the loop draws its batches from" in f.message
    assert "Make the batches ahead of the loop" in f.message
    assert f.seconds_per_step is not None and f.share_of_step is not None
    # The program timed its generator itself: within a generous ratio of it.
    assert 0.4 * made < f.seconds_per_step < 2.5 * made, (f.seconds_per_step, made)
    sites = [x for x in s.sites if x.kind == "host_work" and x.in_generator]
    assert sites and all(x.timed >= 8 for x in sites)
    # The step's Time line names it, no longer all "other".
    from tpu_info.views.breakdown import breakdown

    b = breakdown(s)
    assert b is not None and any(p.name == "your code between steps" for p in b.step_parts)


def test_the_same_host_work_beside_long_device_steps_is_not_raised(tmp_path: Path) -> None:
    s, made = _snapshot_and_timer(tmp_path, size=64, layers=0, steps=150, work=8, sleep=0.02)
    assert not [f for f in find(s) if f.kind == "per_step_host_work"]
    sites = [x for x in s.sites if x.kind == "host_work" and x.in_generator]
    assert sites, "the generator's lines were timed"
    from tpu_info.views.breakdown import breakdown

    b = breakdown(s)  # it would be said, were it the step's
    assert b is not None and b.step_seconds
    assert sum(x.seconds / x.timed for x in sites) >= 0.05 * b.step_seconds
    why = {not_raised(s, x) for x in sites}
    assert any("not host-bound" in w or "ran beside the device's queued steps" in w
               for w in why), why


def _lines() -> object:
    from metrics.engines._frames import LibraryFrames, engine_dirs, skip_prefixes
    from metrics.engines.jax.host_lines import HostLines

    return HostLines(LibraryFrames(skip_prefixes()), engine_dirs())


def test_a_forked_child_times_nothing() -> None:
    lines = _lines()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its copy is off
        os.write(w, b"1" if lines.enabled else b"0")  # type: ignore[attr-defined]
        os._exit(0)
    os.close(w)
    said = os.read(r, 1)
    os.waitpid(pid, 0)
    assert said == b"0" and lines.enabled  # type: ignore[attr-defined]


def test_a_profiler_already_set_is_never_replaced() -> None:
    import sys

    lines = _lines()

    def theirs(frame: object, event: str, arg: object) -> None:
        return None

    sys.setprofile(theirs)
    try:
        lines.after_step(10**18, 10**6)  # type: ignore[attr-defined]
        assert sys.getprofile() is theirs
    finally:
        sys.setprofile(None)


def test_an_exception_in_the_profile_function_never_reaches_the_program() -> None:
    # The profile function runs at every call and return of the user's code,
    # outside any of the hook's guards: what it raises would surface in the
    # program at any line. It ends the interval and is counted instead.
    import sys

    failed: list[tuple[str, BaseException]] = []
    lines = _lines()
    lines.on_error = lambda where, e: failed.append((where, e))  # type: ignore[attr-defined]

    def broken(code: object) -> int:
        raise RuntimeError("broken")

    def user_work() -> int:
        return sum(range(10))

    lines.after_step(10**18, 10**6)  # type: ignore[attr-defined]
    try:
        assert sys.getprofile() is not None  # an interval began at this line
        lines._kind = broken  # type: ignore[attr-defined]
        assert user_work() == 45  # no RuntimeError here
        assert sys.getprofile() is None  # the interval ended
    finally:
        sys.setprofile(None)
    assert [w for w, _ in failed] == ["host_lines"]
