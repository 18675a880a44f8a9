"""``np.asarray(loss)`` of a jax.Array every step, on the CPU: numpy reads it
through its buffer protocol, in C, and the host blocks there until the step
is done (issue 41's flax nnx vae: 4-24 % of its step by A/B), yet no Python
hook sees it. The hook's sampled intervals between steps
(metrics/engines/jax/host_lines.py) see the C call and its argument
(metrics/engines/jax/numpy_reads.py) and keep its time as a read at the
line, not as the user's host work. Real JAX on the CPU, in a subprocess."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

from tests.hooked import PRINT_SNAPSHOT  # noqa: E402
from tpu_info.contract.model import Snapshot  # noqa: E402
from tpu_info.views.breakdown import breakdown  # noqa: E402
from tpu_info.views.findings import find  # noqa: E402

PROGRAM = textwrap.dedent('''
    import json, time
    import numpy as np
    import jax, jax.numpy as jnp
    import metrics
    metrics.install(engines=["jax"])

    @jax.jit
    def step(w, x):
        h = x
        for _ in range(4):
            h = jnp.tanh(h @ w)
        return w - 1e-4 * jnp.mean(h) * jnp.ones_like(w), jnp.mean(h)

    w = jnp.eye(384, dtype=jnp.float32)
    x = jnp.ones((384, 384), jnp.float32)
    host = np.random.rand(200, 200).astype(np.float32)
    losses, waits = [], []
    for i in range(600):
        w, loss = step(w, x)
        t0 = time.perf_counter()
        losses.append(np.asarray({arg}))  # THE LINE
        waits.append(time.perf_counter() - t0)
        y = host
        for _ in range(6):  # the host's own work after the read: the device idles
            y = np.tanh(y) * 0.5 + 0.1
    w.block_until_ready()
    print(json.dumps({{"wait": sorted(waits)[len(waits) // 2]}}))
''')


def _run(tmp_path: Path, arg: str) -> tuple[Snapshot, float, str]:
    """The snapshot the program printed, its own median time in the call,
    and the call's ``prog.py:LINE``."""
    import json
    import os
    import subprocess
    import sys

    from tests.hooked import ROOT
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    source = PROGRAM.format(arg=arg) + PRINT_SNAPSHOT
    (tmp_path / "prog.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(tmp_path / "prog.py")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(json.loads(out[-1])["proto"])))
    line = next(i for i, t in enumerate(source.splitlines(), 1) if "# THE LINE" in t)
    return s, json.loads(out[-2])["wait"], f"prog.py:{line}"


def test_a_per_step_np_asarray_of_a_jax_array_is_a_read_at_its_line(tmp_path: Path) -> None:
    s, wait, line = _run(tmp_path, "loss")
    [read] = [x for x in s.sites if x.kind == "sync" and x.location.endswith(line)]
    assert read.detail == "np.asarray()"
    assert 0 < read.timed < read.count  # sampled: the count is the steps' worth
    assert read.count >= 500 and read.bytes == read.count * 4
    [f] = [f for f in find(s) if f.kind == "per_step_sync" and (f.location or "").endswith(line)]
    assert "np.asarray() at prog.py" in f.message and "every step" in f.message
    assert "sampled" in f.message
    assert f.seconds_per_step is not None and f.seconds_per_step >= 0  # (0: device-bound)
    # The wait left "your code between steps": the line's host work is the
    # time around the call, not in it (no 'asarray' callee), and under its wait.
    work = [x for x in s.sites if x.kind == "host_work" and x.location.endswith(line)]
    assert all("asarray" not in x.detail for x in work)
    per_read = read.seconds / read.timed
    # The program timed its own calls: within a generous ratio of them.
    assert 0.3 * wait < per_read < 3 * wait, (per_read, wait)
    assert all(x.seconds / x.timed < per_read for x in work), (work, read)
    b = breakdown(s)
    assert b is not None and any(p.name == "waits at reads" for p in b.step_parts)


def test_np_asarray_of_a_numpy_array_is_no_read(tmp_path: Path) -> None:
    s, _, line = _run(tmp_path, "host")
    assert not [x for x in s.sites if x.kind == "sync" and x.location.endswith(line)]
    assert not [f for f in find(s) if f.kind == "per_step_sync"]
