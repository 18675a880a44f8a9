"""What timing the user's host code between steps costs a host-bound loop.

    python bench/host_lines_cost.py [--loader choice|rows] [--blocks N] [--block STEPS]

A hooked JAX loop (CPU) whose generator makes each batch on the host, as
issue 41's nnx_lifted does (``choice``: ``np.random.choice`` and numpy
indexing of a 100-row data set; ``rows``: a Python loop over 32 rows of
numpy work), its step a small jitted MLP update. The program times each
iteration (the batch and the step's call) itself; the iterations that ran
while :mod:`metrics.engines.jax.host_lines` timed an interval (its profile
function on) are told apart. Printed: the loop's time, the intervals, the
profile's cost as its extra time in those iterations over the median
iteration that ran without it, as a share of the loop (what it adds to the
program: target < 0.3 %), and the hook's own account of its time
(``own_ns``: its clock reads and its call per event). Only the iterations
after a timed call of the step are compared (an interval begins only
there; the device-time watcher's sample of that call costs the next
iteration the same either way). A figure per
iteration, not per run: a loaded machine moves both sides alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loader", choices=("choice", "rows"), default="choice")
    ap.add_argument("--blocks", type=int, default=20, help="blocks each way")
    ap.add_argument("--block", type=int, default=2000, help="steps a block")
    args = ap.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    import metrics
    from metrics.engines.jax.context import CONTEXT

    metrics.install(engines=["jax"])
    x_all = np.linspace(0, 1, 100)[:, None]
    y_all = 0.8 * x_all ** 2 + 0.1
    wide = np.random.rand(2000, 4096).astype(np.float32)

    def choice(batch: int):  # nnx_lifted's dataset()
        while True:
            idx = np.random.choice(len(x_all), size=batch)
            yield x_all[idx], y_all[idx]

    def rows(batch: int):
        rng = np.random.default_rng(0)
        while True:
            out = []
            for _ in range(batch):
                r = wide[rng.integers(0, len(wide))]
                out.append(np.tanh(r) * 0.5 + np.sqrt(np.abs(r)))
            s = np.stack(out)[:, :1].astype(np.float64)
            yield s, s * 0.5

    @jax.jit
    def step(w, batch):
        x, y = batch

        def loss(w):
            return jnp.mean((jnp.tanh(x @ w[0]) @ w[1] - y) ** 2)

        g = jax.grad(loss)(w)
        return [a - 1e-3 * b for a, b in zip(w, g, strict=True)]

    w = [jnp.ones((1, 32)), jnp.ones((32, 1))]
    lines = CONTEXT.active.host_lines  # type: ignore[union-attr]
    it = (choice if args.loader == "choice" else rows)(32)
    for _ in range(200):  # compiled and past the first calls before the blocks
        w = step(w, next(it))
    # Alternating blocks with the timing off and on (the same process, the
    # same loop: timed calls and the device-time watcher's samples alike),
    # each read on the training thread's CPU clock (the profile's cost is
    # CPU work on it; a loaded machine's waits for a core are not in it) and
    # on the wall clock.
    block = args.block
    cpu: dict[bool, list[int]] = {False: [], True: []}
    wall: dict[bool, list[int]] = {False: [], True: []}
    profiled: list[int] = []
    plain: list[int] = []
    t_loop = time.perf_counter_ns()
    for b in range(2 * args.blocks):
        on = b % 2 == 1
        lines.enabled = on
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        for _ in range(block):
            t0 = time.perf_counter_ns()
            was = lines._at is not None  # the previous step's call began an interval
            w = step(w, next(it))
            if on:
                (profiled if was else plain).append(time.perf_counter_ns() - t0)
        jax.block_until_ready(w)
        cpu[on].append(time.thread_time_ns() - c0)
        wall[on].append(time.perf_counter_ns() - w0)
    loop = time.perf_counter_ns() - t_loop

    def mean(xs: list[int]) -> float:
        return sum(xs) / len(xs)

    print(f"loader {args.loader}: {2 * args.blocks} blocks of {block:,} steps in "
          f"{loop / 1e9:.2f} s; {mean(wall[False]) / block / 1e3:.0f} us a step without")
    print(f"intervals: {lines.intervals}; the hook's own account of the profile: "
          f"{lines.own_ns / 1e6:.2f} ms, {100 * lines.own_ns / (loop / 2):.3f} % of the "
          f"blocks with it (per event outside its clock reads: {lines._leak} ns)")
    # In the blocks with it, per iteration: those an interval ran in against
    # the others (means: a loaded machine's long iterations skew both alike).
    extra = sum(profiled) - mean(plain) * len(profiled)
    print(f"its iterations' extra wall time over the others': {extra / 1e6:.2f} ms, "
          f"{100 * extra / sum(wall[True]):.3f} % of the blocks with it")
    for name, xs in (("thread CPU", cpu), ("wall", wall)):
        off, on_ = mean(xs[False]), mean(xs[True])
        print(f"{name}: with/without {on_ / off:.4f} ({100 * (on_ - off) / off:+.3f} %; "
              "target < 0.3 %)")
    print(f"load: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
