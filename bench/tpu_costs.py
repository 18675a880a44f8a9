"""A finding's cost against an A/B timing: the program with the problem (A) and
without it (B), each run in its own process, alternated; the finding for the
problem's line read from A's own snapshot (issue 41: "within 2x of an A/B
timing on the chip").

Programs (``--program``), plain ``jax.jit`` but ``flax``:

- ``read``: a per-step ``float(loss)`` (``--every 1``) or a print every N
  steps (``--every 20``) in a training loop; B reads nothing in the loop.
- ``numpy``: numpy batches passed straight into the jitted step; B puts the
  whole data set on the device once, as a list of device-resident batches.
- ``flax``: the same feeding into a flax nnx model trained with optax, its
  step under ``nnx.jit`` (flax and optax are imported only here: on the TPU
  machine they come from its own index, ``reference/tpu-machine.md``).
  ``--fix cached`` (flax) keeps A's numpy batches and calls
  ``nnx.cached_partial(train_step, model, opt)`` instead: A - B is what
  ``nnx.jit``'s per-call graph traversal costs (``library_jit_overhead``).
- ``optax``: the same feeding into a plain ``jax.jit`` step that updates its
  parameters with an optax optimizer (issue 41: "a flax or optax example").
  For these three, ``--fix prefetch`` makes B each step's batches
  ``jax.device_put`` one step ahead on the training thread, and (flax, optax)
  ``--fix thread`` puts them ahead in a loader thread, instead of a data set
  put once (on the TPU v5e the put one step ahead on the training thread
  made the loop slower than the copy it replaced: bench/RESULTS-TPU.md).
- ``eval``: an evaluation (another jitted function over several batches, its
  loss read once) every N steps; B skips it. Its cost is periodic work
  (``periodic_evaluation``: the loop's gaps it took, measured by the hook).
- ``checkpoint``: ``jax.device_get`` of the parameters plus host work (pickling
  them) every N steps, no ``mark_step``; B skips it (``periodic_checkpoint``).
- ``eager``: each step's batch gathered from device data by eager indexing
  (``data[idx] * 2 + 1`` outside jit) after a slow first compile of the step
  (``--unroll`` layers unrolled into its graph, inside the loop); B gathers
  inside another jitted function. The finding's share must be of the steady
  step (issue 41 item 3), not diluted by the compile.

Run on the TPU machine (``reference/tpu-machine.md``)::

    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_costs.py --program read --every 1
    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_costs.py --program numpy
    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_costs.py --program flax
    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_costs.py --program eval --every 30
    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_costs.py --program eager --unroll 200
    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_costs.py --program checkpoint --every 25

Each run also prints the steps as the summary says them (steady step and the
compiles inside the loop) and the start-up the hook took out (``opening the
TPU took ...``: the ``jnp.zeros`` that opens the device is no transfer).

It prints, per program, the A and B loop times (median of ``--pairs``
alternated runs), their difference per step, and each finding at the
problem's line with its cost (seconds lost in the loop); ``ratio`` is
finding / (A - B). One process holds the chip at a time: the runs are
sequential.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _common import median, parser

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r'''
import io, json, pickle, sys, time
import numpy as np
import metrics; metrics.install(serve=False)
import jax, jax.numpy as jnp
from tpu_info.views.findings import find
program, variant = sys.argv[1], sys.argv[2]
steps, every, size, unroll = map(int, sys.argv[3:7])
A = variant == "A"
jnp.zeros(()).block_until_ready()  # opening the device: not part of the loop

@jax.jit
def big(w, x):  # the eager program's step: a slow first compile
    h = x
    for i in range(unroll):
        h = jnp.tanh(h @ w + i)
    return w - 1e-4 * jnp.mean(h) * w, jnp.mean(h)

@jax.jit
def gather(d, idx):
    return d[idx] * 2.0 + 1.0

@jax.jit
def step(w, x, y):
    def loss_fn(w):
        h = x
        for _ in range(3):
            h = jnp.tanh(h @ w)
        return jnp.mean((h - y) ** 2)
    loss, g = jax.value_and_grad(loss_fn)(w)
    return w - 1e-3 * g, loss

@jax.jit
def evaluate(w, x, y):
    h = x
    for _ in range(3):
        h = jnp.tanh(h @ w)
    return jnp.mean((h - y) ** 2)

rng = np.random.default_rng(0)
w = jnp.asarray(rng.standard_normal((size, size), np.float32) / size ** 0.5)
data = rng.standard_normal((64, 256, size), np.float32)
on_device = jax.device_put(data)
x0, y0 = on_device[0], on_device[1]
w, loss = step(w, x0, y0); loss.block_until_ready()  # compile outside the timed loop
evaluate(w, x0, y0).block_until_ready()
flat = on_device.reshape(-1, size)
if program == "flax":  # a flax nnx model trained with optax, its step under nnx.jit
    from flax import nnx
    import optax

    class MLP(nnx.Module):
        def __init__(self, n, rngs):
            self.l1, self.l2 = nnx.Linear(n, n, rngs=rngs), nnx.Linear(n, n, rngs=rngs)

        def __call__(self, x):
            return self.l2(jnp.tanh(self.l1(x)))

    model = MLP(size, nnx.Rngs(0))
    try:
        opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    except TypeError:  # flax before 0.11
        opt = nnx.Optimizer(model, optax.adam(1e-3))

    def loss_fn(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    @nnx.jit
    def train_step(model, opt, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        try:
            opt.update(model, grads)
        except TypeError:  # flax before 0.11
            opt.update(grads)
        return loss

    train_step(model, opt, x0, y0).block_until_ready()  # compiles outside the timed loop
    train_step(model, opt, data[0], data[1]).block_until_ready()
    if variant == "C":  # C (--fix cached): flax's own fix for nnx.jit's per-call traversal
        cached_step = nnx.cached_partial(train_step, model, opt)
        cached_step(data[0], data[1]).block_until_ready()
if program == "optax":  # an optax optimizer in a plain jax.jit step
    import optax

    tx = optax.adam(1e-3)
    params = {"w1": w, "w2": w}
    opt_state = tx.init(params)

    @jax.jit
    def optax_step(params, opt_state, x, y):
        def loss_fn(p):
            return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)
        loss, g = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, loss = optax_step(params, opt_state, x0, y0)
    params, opt_state, loss = optax_step(params, opt_state, data[0], data[1])
    loss.block_until_ready()
batches = [on_device[k] for k in range(64)]  # B: device-resident, no per-step work
# P (--fix prefetch): the advice taken: each step's batches put one step ahead
ahead = (jax.device_put(data[0]), jax.device_put(data[1]))
if variant == "T":  # T (--fix thread): a loader thread puts each step's batches ahead
    import queue, threading
    loaded = queue.Queue(maxsize=2)

    def loader():
        for i in range(steps):
            j = i % 63
            loaded.put((jax.device_put(data[j]), jax.device_put(data[j + 1])))

    threading.Thread(target=loader, daemon=True).start()
jax.block_until_ready(batches)
t0 = time.perf_counter()
for i in range(steps):
    if program == "eager":
        idx = (i * 37 + np.arange(256)) % flat.shape[0]
        if A:
            x = flat[idx] * 2.0 + 1.0  # LINE eager
        else:
            x = gather(flat, idx)
        w, loss = big(w, x)
    elif program == "numpy":
        j = i % 63
        if A:
            w, loss = step(w, data[j], data[j + 1])  # LINE numpy
        elif variant == "P":
            (x, y), ahead = ahead, (jax.device_put(data[j + 1]), jax.device_put(data[(j + 2) % 64]))
            w, loss = step(w, x, y)
        else:
            w, loss = step(w, batches[j], batches[j + 1])  # on the device already
    elif program in ("flax", "optax"):
        j = i % 63
        if A or variant == "C":
            x, y = data[j], data[j + 1]
        elif variant == "P":
            (x, y), ahead = ahead, (jax.device_put(data[j + 1]), jax.device_put(data[(j + 2) % 64]))
        elif variant == "T":
            x, y = loaded.get()
        else:
            x, y = batches[j], batches[j + 1]
        if program == "flax" and variant == "C":
            loss = cached_step(x, y)
        elif program == "flax":
            loss = train_step(model, opt, x, y)  # LINE flax
        else:
            params, opt_state, loss = optax_step(params, opt_state, x, y)  # LINE optax
    else:
        w, loss = step(w, x0, y0)
    if program == "read" and A and i % every == 0:
        if every == 1:
            total = float(loss)  # LINE read1
        else:
            print(f"step {i} loss {loss}", file=sys.stderr)  # LINE readN
    if program == "eval" and A and i % every == every - 1:
        acc = sum(evaluate(w, on_device[k], on_device[k + 1]) for k in range(0, 40, 2))  # LINE eval
        print(f"eval {float(acc)}", file=sys.stderr)
    if program == "checkpoint" and A and i % every == every - 1:
        host = jax.device_get({"w": w, "data": on_device[:8]})  # LINE checkpoint
        pickle.dump({k: np.array(v) for k, v in host.items()}, io.BytesIO())
jax.block_until_ready((w, loss))
loop = time.perf_counter() - t0
s = metrics.snapshot()
tag = {"read": "read1" if every == 1 else "readN"}.get(program, program)
the_line = next(n for n, t in enumerate(open(__file__).read().splitlines(), 1)
                if t.endswith(f"# LINE {tag}"))
found = [{"kind": f.kind, "seconds_lost": f.seconds_lost, "message": f.message,
          "share_of_step": f.share_of_step}
         for f in find(s) if f.location and f.location.endswith(f":{the_line}")]
from tpu_info.outputs.summary import _steps_line
startup = [f.message for f in find(s) if f.kind == "backend_startup"]
from tpu_info.views.sites import not_raised
sites = [{"kind": x.kind, "count": x.count, "wait": x.seconds, "drain": x.drain_seconds,
          "not_raised": why}
         for x, why in zip(s.sites, not_raised(s)) if x.location.endswith(f":{the_line}")]
busy = s.distribution("TrainingThreadBusy")
others = [f"{f.kind} at {f.location}: {f.seconds_lost}" for f in find(s) if f not in found]
from metrics.engines.jax.context import CONTEXT
owner = getattr(CONTEXT, "step_owner", None)
copies = ([sorted(c)[len(c) // 2] if c else None for c in owner.copy_stats[:2]]
          if hasattr(owner, "copy_stats") else None)
model = None
if CONTEXT.active is not None:  # what the reads were costed with (drains.Model)
    model = list(CONTEXT.active.implicit.drains.model)
print(json.dumps({"loop": loop, "findings": found, "others": others, "copies": copies,
                  "model": model,
                  "sites": sites, "steps": _steps_line(s),
                  "startup": startup, "uptime": s.uptime_seconds,
                  "busy": [busy.percentile(50.0), busy.count] if busy else None}))
'''


def _run(path: Path, program: str, variant: str, steps: int, every: int, size: int,
         unroll: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    out = subprocess.run([sys.executable, str(path), program, variant, str(steps), str(every),
                          str(size), str(unroll)], capture_output=True, text=True, env=env,
                         timeout=600)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--program", choices=("read", "numpy", "flax", "optax", "eval", "eager",
                                         "checkpoint"),
                   default="read")
    p.add_argument("--unroll", type=int, default=100,
                   help="eager: layers unrolled into the step (its first compile's size)")
    p.add_argument("--every", type=int, default=1, help="steps between reads / evaluations")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--size", type=int, default=512, help="the model's width (matmul size)")
    p.add_argument("--pairs", type=int, default=3, help="alternated A/B runs")
    p.add_argument("--fix", choices=("resident", "prefetch", "thread", "cached"),
                   default="resident",
                   help="B for flax/optax (numpy: not thread): batches on the device from the "
                        "start, each step's batches put one step ahead on the training "
                        "thread, or put ahead by a loader thread; flax: cached is "
                        "nnx.cached_partial(train_step, model, opt) on A's numpy batches")
    args = p.parse_args(argv)
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "tpu_costs_program.py"
    path.write_text(PROGRAM)
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for _ in range(args.pairs):
        for v in ("A", "B"):
            b = {"prefetch": "P", "thread": "T", "cached": "C"}.get(args.fix, "B")
            runs[v].append(_run(path, args.program, b if v == "B" else v, args.steps,
                                args.every, args.size, args.unroll))
    a = median([r["loop"] for r in runs["A"]])
    b = median([r["loop"] for r in runs["B"]])
    said = median([sum(f["seconds_lost"] for f in r["findings"]) for r in runs["A"]])
    print(f"program {args.program} every {args.every} steps {args.steps} size {args.size} "
          f"B: {args.fix}")
    print(f"A {a:.3f} s  B {b:.3f} s  A-B {a - b:.3f} s ({(a - b) / args.steps * 1e3:.3f} ms/step)")
    print(f"finding cost {said:.3f} s  ratio {said / (a - b) if a > b else float('nan'):.2f}")
    up = median([r["uptime"] for r in runs["A"]])
    print(f"share of A's run: A/B {(a - b) / up:.1%}  finding {said / up:.1%} (uptime {up:.2f} s)")
    last = runs["A"][-1]
    share = (a - b) / a if a > 0 else float("nan")
    print(f"A/B share of A's loop {share:.1%}; steps said: {last['steps']}")
    print(f"training thread busy (median %, samples) in A: {[r.get('busy') for r in runs['A']]}")
    for text in last["startup"]:
        print(f"  start-up: {text[:160]}")
    for f in last["findings"]:
        print(f"  {f['kind']} (share of step {f['share_of_step']}): {f['message'][:400]}")
    for x in last["sites"]:
        print(f"  site {x}")
    print(f"  other findings: {last['others']}")
    print(f"  reads costed with (device ns, latency ns, samples, samples, upper quartile): "
          f"{[r.get('model') for r in runs['A']]}")
    print(f"  the step's host ns per call, numpy copied by JAX / put first (medians): "
          f"{[r['copies'] for r in runs['A']]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
