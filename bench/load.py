"""Load: a hooked JAX training loop under 32 streaming watchers plus 500
snapshot calls per second; step rate against the unloaded run, RPC errors,
and the server's memory growth.

    python bench/load.py [--seconds 60] [--smoke]

Targets: step rate >= 0.95 of unloaded, zero RPC errors, memory growth < 10 MB.
The trainer is pinned to one core and the load generator (its own process)
to the other, so the ratio measures the server's cost inside the program.
A third run puts the same load on a bare grpcio server inside the same
(hooked, not serving) program that answers every call with one canned
snapshot: its ratio is the floor grpcio's own per-call work sets (on a core
shared with the training thread), and ours against it is the cost of what
the hook adds per call. A fourth run serves from a helper process
(``metrics.install(serve="process")``), given the load generator's core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
from _common import ROOT, parser, verdict

TRAINER = r"""
import json, os, sys, time, jax, jax.numpy as jnp, numpy as np, psutil, metrics
BARE = sys.argv[2] == "bare"
metrics.install(serve="process" if sys.argv[2] == "helper" else not BARE)
@jax.jit
def step(w, x):
    return w - 0.01 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
w = jnp.ones((64, 64)); x = jnp.ones((32, 64))
for _ in range(50): w = step(w, x)
if BARE:
    # The floor: a plain grpcio server in this process, same pool size,
    # answering every call with one snapshot encoded now (no work per call).
    from concurrent import futures
    import grpc
    from tpu_info.wire import encoder
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    canned = encoder.snapshot_to_bytes(metrics.snapshot())
    def stream(request, context):
        while context.is_active():
            yield canned
            time.sleep(request.interval_ms / 1000)
    same = lambda b: b
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=40))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("tpu_info.v1.Monitor", {
        "GetSnapshot": grpc.unary_unary_rpc_method_handler(lambda r, c: canned, same, same),
        "StreamSnapshots": grpc.unary_stream_rpc_method_handler(
            stream, pb.StreamRequest.FromString, same)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    address = f"127.0.0.1:{port}"
else:
    address = metrics.exporter().address
print(json.dumps({"address": address}), flush=True)
sys.stdin.readline()  # go
proc = psutil.Process()
seconds = float(sys.argv[1]); rss0 = proc.memory_info().rss
n = 0; t0 = time.perf_counter(); rss_warm = None
while time.perf_counter() - t0 < seconds:
    w = step(w, jax.device_put(np.ones((32, 64), np.float32))); metrics.mark_step(); n += 1
    if rss_warm is None and time.perf_counter() - t0 > seconds / 4:
        rss_warm = proc.memory_info().rss  # threads and buffers of the load now exist
w.block_until_ready()
rss = proc.memory_info().rss
print(json.dumps({"steps_per_s": n / (time.perf_counter() - t0),
                  "rss_growth_mb": (rss - rss0) / 2**20,
                  "rss_growth_after_warmup_mb": (rss - rss_warm) / 2**20}), flush=True)
sys.stdin.readline()  # keep serving until the load generator is done
"""

LOADER = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[3])
from tpu_info.net.client import Client
from tpu_info.contract.errors import TpuInfoError
target, seconds = sys.argv[1], float(sys.argv[2])
errors = []; calls = [0]; streamed = [0]
stop = time.monotonic() + seconds
def watcher():
    try:
        with Client(target, timeout=seconds + 10) as c:
            for _ in c.stream(interval_s=1.0, duration_s=seconds):
                streamed[0] += 1
    except TpuInfoError as e:
        errors.append(repr(e))
def poller(rate):
    # Raw calls (the reply is parsed, not turned into model records): the
    # load generator shares a core and must not be what limits the rate.
    import grpc
    from tpu_info.proto import tpu_info_v1_pb2 as pb, tpu_info_v1_pb2_grpc as pb_grpc
    with grpc.insecure_channel(target) as channel:
        get = pb_grpc.MonitorStub(channel).GetSnapshot
        request = pb.SnapshotRequest(events_since=2**62)
        next_t = time.monotonic()
        while time.monotonic() < stop:
            try:
                get(request, timeout=5); calls[0] += 1
            except grpc.RpcError as e:
                errors.append(f"{e.code()}: {e.details()}")
            next_t += 1.0 / rate
            time.sleep(max(0.0, next_t - time.monotonic()))
threads = [threading.Thread(target=watcher) for _ in range(32)]
threads += [threading.Thread(target=poller, args=(500 / 8,)) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"errors": errors[:5], "n_errors": len(errors), "calls_per_s": calls[0] / seconds,
                  "streamed": streamed[0]}))
"""


def _pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[cpu % len(cpus)]})


def trainer(seconds: float, load: bool, mode: str = "hook") -> tuple[dict, dict | None]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_PORT="0", JAX_PLATFORMS="cpu",
               TPU_INFO_RUNTIME_DIR=os.path.join("/tmp", f"tpu-info-load-{os.getpid()}"))
    # The trainer gets one core, the load generator the other: what is left
    # of the slowdown is the server's work inside the trained process.
    p = subprocess.Popen([sys.executable, "-c", TRAINER, str(seconds),
                          mode], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         preexec_fn=lambda: _pin(0))
    address = json.loads(p.stdout.readline())["address"]
    helpers = psutil.Process(p.pid).children() if mode == "helper" else []
    for child in helpers:
        # A process of its own, so the scheduler may run it on any core; the
        # trainer here was pinned to one, so the helper gets the other.
        cpus = sorted(os.sched_getaffinity(0))
        for thread in child.threads():  # affinity is per thread
            os.sched_setaffinity(thread.id, {cpus[1 % len(cpus)]})
    helper_rss: list[int] = []  # at a quarter of the run (warm) and at the end
    loader = None
    out: dict = {}
    if load:
        loader = subprocess.Popen([sys.executable, "-c", LOADER, address, str(seconds + 1),
                                   str(ROOT)], stdout=subprocess.PIPE, text=True, env=env,
                                  preexec_fn=lambda: _pin(1))
        time.sleep(1.0)  # let the watchers connect
    p.stdin.write("go\n")
    p.stdin.flush()
    if helpers:
        time.sleep(seconds / 4)
        helper_rss.append(sum(h.memory_info().rss for h in helpers))
    result = json.loads(p.stdout.readline())
    if helpers:
        helper_rss.append(sum(h.memory_info().rss for h in helpers))
        result["helper_rss_growth_after_warmup_mb"] = (helper_rss[1] - helper_rss[0]) / 2**20
        result["helper_rss_mb"] = helper_rss[1] / 2**20
    if loader is not None:
        out = json.loads(loader.communicate(timeout=seconds + 60)[0])
    p.stdin.write("done\n")
    p.stdin.close()
    p.wait(timeout=30)
    return result, (out if load else None)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    seconds = 5.0 if args.smoke else args.seconds
    base, _ = trainer(seconds, load=False)
    loaded, load = trainer(seconds, load=True)
    floor, floor_load = trainer(seconds, load=True, mode="bare")
    helped, helped_load = trainer(seconds, load=True, mode="helper")
    assert load is not None and floor_load is not None and helped_load is not None
    ratio = loaded["steps_per_s"] / base["steps_per_s"]
    floor_ratio = floor["steps_per_s"] / base["steps_per_s"]
    print(f"unloaded {base['steps_per_s']:.0f} steps/s; under load {loaded['steps_per_s']:.0f} "
          f"steps/s; {load['calls_per_s']:.0f} snapshot calls/s served, "
          f"{load['streamed']} streamed snapshots, {load['n_errors']} RPC errors {load['errors']}")
    print(f"the same load on a bare grpcio server in the program (canned answer, no work per "
          f"call): {floor['steps_per_s']:.0f} steps/s, ratio {floor_ratio:.3f}: the part of the "
          "slowdown that is grpcio's own per-call cost")
    helped_ratio = helped["steps_per_s"] / base["steps_per_s"]
    print(f"serving from a helper process (install(serve='process')): "
          f"{helped['steps_per_s']:.0f} steps/s; {helped_load['calls_per_s']:.0f} calls/s served, "
          f"{helped_load['streamed']} streamed, {helped_load['n_errors']} RPC errors "
          f"{helped_load['errors']}")
    verdict("load step-rate ratio", ratio, ">= 0.95", ratio >= 0.95)
    verdict("load step-rate ratio, serve='process'", helped_ratio, ">= 0.95",
            helped_ratio >= 0.95)
    verdict("load RPC errors, serve='process'", helped_load["n_errors"], "== 0",
            helped_load["n_errors"] == 0)
    grow_h = helped["helper_rss_growth_after_warmup_mb"]
    print(f"helper process RSS {helped['helper_rss_mb']:.0f} MB; the program's own RSS "
          f"+{helped['rss_growth_after_warmup_mb']:.1f} MB after warm-up")
    verdict("load helper RSS growth after warm-up MB, serve='process'", grow_h, "< 10",
            grow_h < 10)
    verdict("load step-rate ratio against the bare-grpcio floor", ratio / floor_ratio, ">= 0.95",
            ratio / floor_ratio >= 0.95)
    verdict("load RPC errors", load["n_errors"], "== 0", load["n_errors"] == 0)
    print(f"server RSS: +{loaded['rss_growth_mb']:.1f} MB from the start of the load "
          "(40 threads, their stacks and gRPC buffers), then")
    grow = loaded["rss_growth_after_warmup_mb"]
    verdict("load server RSS growth after warm-up MB", grow, "< 10", grow < 10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
