"""Capture as an attack: what one ``Capture(device=True)`` from another local
user (or any caller without the program's secret) costs a hooked JAX program.

    python bench/capture_victim.py [--duration-ms 5000] [--serve process]
                                   [--as-uid 65534] [--owner] [--opt-in] [--smoke]

Starts a hooked training loop with its own ``$TMPDIR``, measures its step
rate and RSS, then an attacker process (after ``setuid`` to ``--as-uid`` when
run as root, so it cannot read the 0600 discovery record) asks for a device
capture. Prints the attacker's answer, the victim's RSS before / peak / 2 s
after, its step rate during the capture against before, and the files left in
its temporary directory. ``--owner`` sends the secret from the record instead
(what ``tpu-info profile`` does for the program's owner), to measure what an
allowed capture leaves behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from _common import ROOT, parser, verdict

VICTIM = r"""
import os, sys, time, jax, jax.numpy as jnp, metrics, profiler  # profiler: the capture
metrics.install(engines=["jax"], serve=os.environ.get("VICTIM_SERVE") or None)
@jax.jit
def step(w, x):
    return w - 0.01 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
w = jnp.ones((256, 256)); x = jnp.ones((128, 256))
print(metrics.exporter().address, flush=True)
n = 0
while True:
    w = step(w, x).block_until_ready()
    metrics.mark_step()
    n += 1
    if n % 20 == 0:
        print(n, time.monotonic(), flush=True)
"""

# A flood of refused captures: 8 threads for N seconds; prints calls made.
FLOODER = r"""
import sys, threading, time, grpc
from tpu_info.proto import tpu_info_v1_pb2 as pb, tpu_info_v1_pb2_grpc as pb_grpc
address, seconds = sys.argv[1], float(sys.argv[2])
calls = [0] * 8
end = time.monotonic() + seconds
def run(i):
    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.MonitorStub(ch)
        while time.monotonic() < end:
            try:
                stub.Capture(pb.CaptureRequest(duration_ms=1000, device=True), timeout=5)
            except grpc.RpcError:
                pass
            calls[i] += 1
ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sum(calls))
"""

# The attacker: another process, optionally another uid, with a raw stub.
ATTACKER = r"""
import json, os, sys, grpc
from tpu_info.proto import tpu_info_v1_pb2 as pb, tpu_info_v1_pb2_grpc as pb_grpc
address, duration_ms, uid, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if uid >= 0:
    os.setgid(uid); os.setuid(uid)
md = [("tpu-info-capture-token", token)] if token else None
options = [("grpc.max_receive_message_length", 1 << 27)]
with grpc.insecure_channel(address, options=options) as ch:
    try:
        r = pb_grpc.MonitorStub(ch).Capture(
            pb.CaptureRequest(duration_ms=duration_ms, device=True),
            timeout=duration_ms / 1000 + 120, metadata=md)
        print(json.dumps({"status": "OK", "trace_bytes": len(r.trace), "files": len(r.files),
                          "notes": list(r.notes)[-2:]}))
    except grpc.RpcError as e:
        print(json.dumps({"status": e.code().name, "details": e.details()}))
"""


def _tree(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def _secret(runtime: Path, pid: int) -> str:
    try:
        return str(json.loads((runtime / f"{pid}.json").read_text()).get("capture_secret", ""))
    except OSError:
        return ""


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--duration-ms", type=int, default=5000)
    p.add_argument("--serve", default="", help="'process' for the helper")
    p.add_argument("--as-uid", type=int, default=-1, help="attacker's uid (needs root)")
    p.add_argument("--owner", action="store_true", help="send the secret from the record")
    p.add_argument("--flood", type=float, default=0.0,
                   help="instead: seconds of 8 threads calling Capture without the secret")
    p.add_argument("--opt-in", action="store_true",
                   help="the victim allows device traces (TPU_INFO_DEVICE_CAPTURE=1)")
    args = p.parse_args()
    if args.smoke:
        args.duration_ms = min(args.duration_ms, 500)
    work = Path(tempfile.mkdtemp(prefix="capture-victim-"))
    tmp, runtime = work / "tmp", work / "rt"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp), TPU_INFO_PORT="0",
               TPU_INFO_RUNTIME_DIR=str(runtime), JAX_PLATFORMS="cpu",
               VICTIM_SERVE=args.serve, TPU_INFO_DEVICE_CAPTURE="1" if args.opt_in else "")
    victim = subprocess.Popen([sys.executable, "-c", VICTIM], stdout=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT)
    address = victim.stdout.readline().strip() if victim.stdout else ""
    steps: list[tuple[int, float]] = []
    threading.Thread(target=lambda: [steps.append(tuple(map(float, line.split())))
                                     for line in victim.stdout], daemon=True).start()
    proc = psutil.Process(victim.pid)

    def rss() -> int:
        return proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children())

    def rate(t0: float, t1: float) -> float:
        inside = [s for s in steps if t0 <= s[1] <= t1]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1][0] - inside[0][0]) / (inside[-1][1] - inside[0][1])

    try:
        time.sleep(1.0 if args.smoke else 4.0)
        t0 = time.monotonic()
        time.sleep(0.5 if args.smoke else 3.0)
        base = rate(t0, time.monotonic())
        before = rss()
        if args.flood:
            t1 = time.monotonic()
            flood = subprocess.run([sys.executable, "-c", FLOODER, address, str(args.flood)],
                                   capture_output=True, text=True, env=env, cwd=ROOT)
            t2 = time.monotonic()
            during = rate(t1 + 1.0, t2)  # after the flooder's own start-up
            print(f"flood of refused captures: {flood.stdout.strip() or flood.stderr[-300:]} "
                  f"calls in {args.flood:g} s; victim step rate {during / base:.2f}x of before "
                  f"({during:.1f} vs {base:.1f} steps/s); RSS {before / 1e6:.0f} -> "
                  f"{rss() / 1e6:.0f} MB; load average {os.getloadavg()[0]:.2f}")
            return 0
        token = _secret(runtime, victim.pid) if args.owner else ""
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                peak.append(rss())

        threading.Thread(target=sample, daemon=True).start()
        t1 = time.monotonic()
        attack = subprocess.run([sys.executable, "-c", ATTACKER, address,
                                 str(args.duration_ms), str(args.as_uid), token],
                                capture_output=True, text=True, env=env, cwd=ROOT)
        t2 = time.monotonic()
        done.set()
        during = rate(t1, t2)
        time.sleep(2.0)
        after = rss()
        n_files, n_bytes = _tree(tmp)
        load = os.getloadavg()[0]
        print(f"attacker (uid {args.as_uid if args.as_uid >= 0 else os.getuid()}, "
              f"{'with' if token else 'without'} secret, serve={args.serve or 'in-program'}): "
              f"{attack.stdout.strip() or attack.stderr.strip()[-300:]}")
        print(f"victim RSS before {before / 1e6:.0f} MB, peak {max(peak) / 1e6:.0f} MB, "
              f"2 s after {after / 1e6:.0f} MB")
        print(f"victim step rate during the capture / before: {during / base:.2f} "
              f"({during:.1f} vs {base:.1f} steps/s)")
        print(f"files left in the victim's TMPDIR: {n_files} ({n_bytes / 1e6:.1f} MB)")
        print(f"load average {load:.2f}")
        if not token:  # the attack: it must change nothing
            refused = '"PERMISSION_DENIED"' in attack.stdout
            verdict("capture_victim refused", float(refused), "1", refused)
            verdict("capture_victim RSS growth MB", (after - before) / 1e6, "< 20",
                    after - before < 20e6)
        verdict("capture_victim files left", float(n_files), "0", n_files == 0)
    finally:
        victim.kill()
        victim.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
