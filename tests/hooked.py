"""A real hooked JAX program in a subprocess, serving its metrics (test helper)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tpu_info.contract.model import Snapshot

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r"""
import json, os, sys
import jax, jax.numpy as jnp, numpy as np
import metrics
import profiler  # registers the capture the server runs (test_export_helper captures)

metrics.install(engines=["jax"], port=int(os.environ.get("HOOK_PORT", "0")))

@jax.jit
def f(x):
    return (x * 2).sum()

tf = metrics.track(f, name="f")
for n in (8, 8, 16, 16, 16):
    tf(jnp.ones(n)).block_until_ready()
keep = []
for i in range(int(os.environ.get("TRANSFERS", "20"))):
    y = jax.device_put(np.arange(1000.0 + i, dtype=np.float32))  # host data: a transfer
    keep.append(jax.device_get(y))
ex = metrics.exporter()
print(json.dumps({"port": ex.port, "address": ex.address}), flush=True)
sys.stdin.read()  # serve until the parent closes stdin
ex.stop()
"""


class HookedProgram:
    """Starts :data:`PROGRAM`; ``.address`` is where it serves. Use as a context manager."""

    def __init__(self, env: dict[str, str] | None = None, timeout: float = 120.0) -> None:
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.setdefault("JAX_PLATFORMS", "cpu")
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=full_env, cwd=ROOT,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise RuntimeError(f"hooked program did not start: {err[-2000:]}")
        info = json.loads(line)
        self.port: int = info["port"]
        self.address: str = info["address"]

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> HookedProgram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def terminate(process: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """Stops a server a test started (SIGTERM, then SIGKILL after ``timeout``)."""
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()


# The last lines of a program for snapshot_printed_by: its snapshot as the wire carries it.
PRINT_SNAPSHOT = '''
s = metrics.snapshot()
from tpu_info.wire.fillers import snapshot_to_proto
print(json.dumps({"proto": snapshot_to_proto(s).SerializeToString().hex()}))
'''


def snapshot_printed_by(tmp_path: Path, source: str, name: str = "prog.py") -> Snapshot:
    """Runs ``source`` (a JAX program on the CPU that ends with
    :data:`PRINT_SNAPSHOT`) in its own process and decodes the snapshot it
    printed, as the CLI reads one."""
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp_path / name
    prog.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(prog)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(
        json.loads(r.stdout.splitlines()[-1])["proto"])))
