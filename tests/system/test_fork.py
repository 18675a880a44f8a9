"""A forked child of a hooked program owns none of its exporter: real PyTorch
DataLoader workers and real ``multiprocessing`` fork children of a hooked
JAX program run none of the exporter's exit or signal work, hold none of its
sockets, touch no discovery record, and exit as they would without the hook.

Each child traces itself (``sys.setprofile``) from its first line to its
exit and writes down every call into grpc or the serving modules: the list
must be empty. No wall-time asserts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Shared by both programs: a tracer for the child, and facts about what it holds.
TRACER = r"""
import json, os, signal, sys
import grpc, psutil
import metrics
from metrics.export import discovery, helper, helper_channel, prometheus, server

OUT = sys.argv[1]
WATCHED = (os.path.dirname(grpc.__file__), server.__file__, helper.__file__,
           helper_channel.__file__, prometheus.__file__)

def trace_calls():
    hits = os.path.join(OUT, f"calls-{os.getpid()}.txt")
    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(WATCHED):
            with open(hits, "a") as f:
                f.write(f"{frame.f_code.co_filename}:{frame.f_code.co_name}\n")
    sys.setprofile(profile)

def facts(ports):
    held = sorted({c.laddr.port for c in psutil.Process().net_connections("tcp")}
                  & set(ports))
    return {"pid": os.getpid(), "sigterm_default": signal.getsignal(signal.SIGTERM)
            is signal.SIG_DFL, "exporter": metrics.exporter() is not None,
            "prometheus": metrics.prometheus_endpoint() is not None, "held_ports": held,
            "unix_sockets": len(psutil.Process().net_connections("unix"))}

def write(name, value):
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(value, f)
"""

LOADER = TRACER + r"""
import torch
from torch.utils.data import DataLoader, TensorDataset
from tpu_info.net.client import Client

metrics.install()
PORTS = [metrics.exporter().port, metrics.prometheus_endpoint().port]

def init(worker_id):
    write(f"worker-{os.getpid()}.json", facts(PORTS))
    trace_calls()

loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=16, num_workers=2,
                    worker_init_fn=init)
for epoch in range(2):
    for _ in loader:
        pass
# The parent still serves, on both endpoints, and its record is in place.
with Client(metrics.exporter().address, timeout=10) as c:
    served_pid = c.snapshot().process.pid
import urllib.request
scraped = urllib.request.urlopen(metrics.prometheus_endpoint().url, timeout=10).status
write("parent.json", {"pid": os.getpid(), "served_pid": served_pid, "scraped": scraped,
                      "record": discovery.published() is not None})
"""

FORKS = TRACER + r"""
import multiprocessing as mp, time
import jax, jax.numpy as jnp
from tpu_info.net.client import Client

metrics.install(engines=["jax"])
jax.jit(lambda x: (x * 2).sum())(jnp.ones(8)).block_until_ready()
PORTS = [metrics.exporter().port]

def work(n):
    trace_calls()
    write(f"worker-{os.getpid()}.json", facts(PORTS))
    return sum(i * i for i in range(n))

def sleeper(ready):
    trace_calls()
    write(f"sleeper-{os.getpid()}.json", facts(PORTS))
    ready.set()
    time.sleep(60)

def installer(ready, done):
    metrics.install(engines=["jax"])  # a child's own exporter, as any process's
    ex = metrics.exporter()
    write(f"installer-{os.getpid()}.json", {"port": ex.port, "address": ex.address,
          "record": str(discovery.published())})
    ready.set()
    done.wait(60)

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=work, args=(1000,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    pool = ctx.Pool(2)
    pool.map(work, [100] * 4)
    pool.close()
    pool.join()
    ready = ctx.Event()
    p = ctx.Process(target=sleeper, args=(ready,))
    p.start()
    ready.wait(30)
    os.kill(p.pid, signal.SIGTERM)
    p.join(30)
    ready, done = ctx.Event(), ctx.Event()
    own = ctx.Process(target=installer, args=(ready, done))
    own.start()
    ready.wait(60)
    info = json.load(open(os.path.join(OUT, f"installer-{own.pid}.json")))
    with Client(info["address"], timeout=10) as c:
        own_served = c.snapshot().process.pid
    done.set()
    own.join(60)
    with Client(metrics.exporter().address, timeout=10) as c:
        served_pid = c.snapshot().process.pid
    write("parent.json", {"pid": os.getpid(), "exits": [q.exitcode for q in procs],
          "sigterm_exit": p.exitcode, "own_exit": own.exitcode, "own_pid": own.pid,
          "own_served": own_served, "own_port": info["port"], "own_record": info["record"],
          "served_pid": served_pid, "port": metrics.exporter().port,
          "record": discovery.published() is not None})
"""


def _run_program(code: str, tmp_path: Path, **env: str) -> tuple[dict, list[dict], Path]:
    out, runtime = tmp_path / "out", tmp_path / "rt"
    out.mkdir()
    runtime.mkdir(mode=0o700)
    full = dict(os.environ)
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    full.update({"TPU_INFO_RUNTIME_DIR": str(runtime), **env})
    script = tmp_path / "program.py"  # a file, so multiprocessing children can import it
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                       text=True, timeout=180, env=full, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    calls = sorted(p.name for p in out.glob("calls-*.txt") if p.read_text())
    assert calls == [], "a child called into the parent's exporter: " + "; ".join(
        sorted({ln for p in out.glob("calls-*.txt") for ln in p.read_text().splitlines()}))
    parent = json.loads((out / "parent.json").read_text())
    children = [json.loads(p.read_text()) for p in sorted(out.glob("*-*.json"))
                if not p.name.startswith("installer-")]
    return parent, children, runtime


def _inert(child: dict) -> None:
    assert child["sigterm_default"], child  # as without the hook
    assert not child["exporter"] and not child["prometheus"], child
    assert child["held_ports"] == [], child  # its copies of the parent's sockets are closed
    assert child["unix_sockets"] == 0, child  # and of the serving helper's socket


@pytest.mark.slow
def test_dataloader_workers_run_none_of_the_exporter(tmp_path: Path):
    parent, workers, runtime = _run_program(LOADER, tmp_path, TPU_INFO_PROMETHEUS_PORT="0")
    assert len(workers) == 4  # two workers, two epochs
    for w in workers:
        _inert(w)
    assert parent["served_pid"] == parent["pid"] and parent["scraped"] == 200
    assert parent["record"]
    # The parent removed its own record at exit; no worker wrote one.
    assert list(runtime.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("serve", ["1", "process"])
def test_multiprocessing_fork_children_of_a_hooked_jax_program(tmp_path: Path, serve: str):
    parent, children, runtime = _run_program(FORKS, tmp_path, TPU_INFO_SERVE=serve)
    assert parent["exits"] == [0, 0, 0]
    assert parent["sigterm_exit"] == -15  # killed by the signal, as without the hook
    assert len(children) >= 4  # three Process children, pool workers, the sleeper
    for c in children:
        _inert(c)
    assert parent["served_pid"] == parent["pid"] and parent["record"]
    # A child that installs serves itself, on a port of its own, with its own record.
    assert parent["own_exit"] == 0 and parent["own_served"] == parent["own_pid"]
    assert parent["own_port"] != parent["port"]
    assert parent["own_record"].endswith(f"{parent['own_pid']}.json")
    assert list(runtime.iterdir()) == []  # each removed its own record, nobody else's


HAMMERED = r"""
import os, signal, threading, time
import metrics

metrics.install(engines=[], serve=False)
stop = threading.Event()

def read_snapshots():  # what the server's threads do while clients watch
    while not stop.is_set():
        metrics.snapshot()
        for _ in range(300):
            metrics.mark_step()

threading.Thread(target=read_snapshots, daemon=True).start()
hung = 0
for _ in range(30):
    pid = os.fork()
    if pid == 0:
        # A child stuck on a lock its parent's thread held never finishes and dies
        # of this; a live child takes ~50 ms, and 30 s leaves room for a VM stall
        # (one child of 30 died at 10 s once, under a fresh clone's whole suite).
        signal.alarm(30)
        for _ in range(3000):  # enough to fold the step journal
            metrics.mark_step()
        metrics.snapshot()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    hung += os.WIFSIGNALED(status)
stop.set()
print("hung", hung)
"""


@pytest.mark.slow
def test_a_child_forked_while_a_thread_reads_snapshots_never_waits_on_its_locks():
    r = subprocess.run([sys.executable, "-c", HAMMERED], capture_output=True, text=True,
                       timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["hung", "0"]
