"""What the hook costs a program that forks: DataLoader epoch ends and JAX fork children.

    python bench/fork.py [--smoke] [--pairs N]

DataLoader: a child process iterates ``DataLoader(TensorDataset(...),
num_workers=2)`` for several epochs, with the hook installed (serving, the
default) or not, in alternated pairs of fresh processes (10 by default).
Each whole epoch (workers forked, batches, workers joined) and each epoch's
end (the last batch to ``StopIteration``, when the loader joins its forked
workers) is timed; per pair, the ratio of the hooked process's median epoch
to the plain one's, and their difference. Printed: the median ratio with a
95 % bootstrap interval over the pairs, and the differences' median, min
and max. Targets: whole epoch <= 1.1, epoch end <= 2 (a forked worker runs
none of the parent's exporter; before, each worker's exit waited out the
server's 5 s stop).

JAX: a hooked JAX program (and a plain one) starts ``multiprocessing``
fork children (``Process`` and a ``Pool``) that compute a little and exit,
then gets SIGTERM-ed ones; the children's exit codes are printed. Target:
every child exits as it would without the hook (0, or -15 for SIGTERM; a
pool worker 0 or -15 after ``terminate()``, whichever came first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _common import ROOT, median, parser, pooled, verdict

LOADER = r"""
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
if sys.argv[1] == "hooked":
    import metrics
    metrics.install()
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
loader = DataLoader(data, batch_size=64, num_workers=2)
ends, epochs = [], []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    t1 = time.perf_counter()
    try:
        next(it)
    except StopIteration:
        pass
    del it
    t2 = time.perf_counter()
    ends.append(t2 - t1)
    epochs.append(t2 - t0)
print(json.dumps({"ends": ends, "epochs": epochs}), flush=True)
"""

FORKS = r"""
import json, multiprocessing as mp, os, signal, sys, time
import jax, jax.numpy as jnp
if sys.argv[1] == "hooked":
    import metrics
    metrics.install(engines=["jax"])
jax.jit(lambda x: (x * 2).sum())(jnp.ones(8)).block_until_ready()

def work(n):
    return sum(i * i for i in range(n))

def sleeper(ready):
    ready.set()
    time.sleep(60)

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    t0 = time.perf_counter()
    procs = [ctx.Process(target=work, args=(10_000,)) for _ in range(int(sys.argv[2]))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    codes = [p.exitcode for p in procs]
    spent = time.perf_counter() - t0
    pool = ctx.Pool(2)
    pool.map(work, [1000] * 8)
    workers = list(pool._pool)
    pool.terminate()  # what leaving `with Pool()` does: SIGTERM to each worker
    pool_codes = [w.exitcode for w in workers]
    term = []
    for _ in range(2):
        ready = ctx.Event()
        p = ctx.Process(target=sleeper, args=(ready,))
        p.start()
        ready.wait(30)
        os.kill(p.pid, signal.SIGTERM)
        p.join(30)
        term.append(p.exitcode)
    print(json.dumps({"exit": codes, "seconds": spent, "pool": pool_codes, "sigterm": term}),
          flush=True)
"""


def _child(code: str, *args: str, timeout: float = 600) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TPU_INFO_PORT", "0")  # never take 8431 from a real libtpu
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=ROOT)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"error": f"exit {r.returncode}: {r.stderr.strip()[-600:]}"}
    return json.loads(lines[-1])


def bench_loader(smoke: bool, pairs: int) -> None:
    pairs, epochs = (1, 3) if smoke else (pairs, 5)
    ends: dict[str, list[float]] = {"plain": [], "hooked": []}
    whole: dict[str, list[float]] = {"plain": [], "hooked": []}
    end_ratios, epoch_ratios, epoch_diffs = [], [], []
    for i in range(pairs):
        order = ("plain", "hooked") if i % 2 == 0 else ("hooked", "plain")
        got = {v: _child(LOADER, v, str(epochs)) for v in order}
        for v, r in got.items():
            if "error" in r:
                print(f"dataloader {v} failed: {r['error']}")
                raise SystemExit(1)
        # The first epoch starts the workers' imports: keep the steady ones.
        med: dict[str, tuple[float, float]] = {}
        for v in ("plain", "hooked"):
            ends[v] += got[v]["ends"][1:]
            whole[v] += got[v]["epochs"][1:]
            med[v] = (median(got[v]["ends"][1:]), median(got[v]["epochs"][1:]))
        end_ratios.append(med["hooked"][0] / med["plain"][0])
        epoch_ratios.append(med["hooked"][1] / med["plain"][1])
        epoch_diffs.append(med["hooked"][1] - med["plain"][1])
    print(f"DataLoader(num_workers=2) epoch end: plain {median(ends['plain']) * 1e3:.1f} ms, "
          f"hooked {median(ends['hooked']) * 1e3:.1f} ms; whole epoch: plain "
          f"{median(whole['plain']) * 1e3:.1f} ms, hooked {median(whole['hooked']) * 1e3:.1f} ms "
          f"(medians of {len(whole['plain'])} epochs each, {pairs} alternated pairs of "
          "fresh processes)")
    diffs = sorted(epoch_diffs)
    print(f"whole epoch hooked / plain, per pair: {pooled([epoch_ratios])}; hooked - plain "
          f"per pair: median {median(diffs) * 1e3:+.1f} ms, min {diffs[0] * 1e3:+.1f}, "
          f"max {diffs[-1] * 1e3:+.1f}")
    print(f"epoch end hooked / plain, per pair: {pooled([end_ratios])}")
    value = median(epoch_ratios)
    verdict("fork dataloader whole epoch hooked/plain", value, "<= 1.1", value <= 1.1)
    value = median(end_ratios)
    verdict("fork dataloader epoch-end hooked/plain", value, "<= 2", value <= 2.0)


def bench_forks(smoke: bool) -> None:
    children = 2 if smoke else 8
    got = {}
    for variant in ("plain", "hooked"):
        r = got[variant] = _child(FORKS, variant, str(children))
        if "error" in r:
            print(f"jax fork {variant}: failed: {r['error']}")
            continue
        print(f"jax fork {variant}: Process children exit {r['exit']} "
              f"({r['seconds']:.2f} s to start and join {children}), Pool workers after "
              f"terminate() {r['pool']}, SIGTERM-ed children {r['sigterm']}")
    # A pool worker may have left before terminate() reached it: 0 or -15, both
    # as without the hook; 1, 143, -11 or None (still alive) are the hook's harm.
    ok = all("error" not in r for r in got.values()) and all(
        got["hooked"][k] == got["plain"][k] for k in ("exit", "sigterm")) and all(
        c in (0, -15) for c in got["hooked"]["pool"])
    verdict("fork jax children exiting as without the hook", 1.0 if ok else 0.0, "1", ok)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--pairs", type=int, default=10,
                    help="alternated pairs of DataLoader processes (default 10)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    bench_loader(args.smoke, args.pairs)
    bench_forks(args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
