"""The hook's overhead on a host-bound loop on the chip: plain and hooked, each in
its own process, alternated (issue 40: >= 0.99 of unhooked steps/s).

    JAX_PLATFORMS=tpu python3 bench/tpu_hostbound.py [--pairs 4] [--steps 4000]

The loop is a one-layer language model whose step takes ~0.55 ms on a TPU v5e:
each step passes two numpy slices and a Python float straight into the jitted
step (the per-step work of implicit transfers and Python scalars into jit).
One process holds the chip at a time, so the runs are sequential; each prints
its median steps/s over five blocks, and the pair's ratio is hooked / plain.
``--one plain|hooked`` runs a single process (what the driver starts).
``--variants hooked,no-watcher,...`` alternates plain with each named hooked
variant (:data:`VARIANTS`: the hook with one part switched off, to find what
costs on the chip by A/B).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

from _common import median, parser

V, D, B, T = 256, 128, 16, 32


def _no_watcher() -> None:
    from metrics.engines.jax import device_time

    device_time.DeviceTimes.offer = lambda *a, **k: None  # type: ignore[method-assign]


def _no_probe() -> None:
    from metrics.engines.jax import device_time

    device_time.PROBE_EVERY = 1 << 62  # only the first sample reads


def _no_timed_copy() -> None:
    from metrics.engines.jax import jit_numpy

    def untimed(self, owner, args, depth):  # type: ignore[no-untyped-def]
        self.report(owner, args, depth + 1) if hasattr(self, "report") else None
        return args

    jit_numpy.JitArguments.timed = untimed  # type: ignore[method-assign]


def _no_gaps() -> None:
    from metrics.engines.jax import calls

    calls.at_call = lambda *a: None  # type: ignore[assignment]


def _untimed() -> None:
    from metrics.engines.jax import calls

    calls.counting.__defaults__ = (1 << 62, 64)  # the first 64 calls timed, none after


# Hooked variants: each switches one part of the hook off (applied after install,
# before the program's jax.jit).
VARIANTS = {"hooked": lambda: None, "no-watcher": _no_watcher, "no-probe": _no_probe,
            "no-timed-copy": _no_timed_copy, "no-gaps": _no_gaps, "untimed": _untimed,
            "no-serve": lambda: None, "unhooked": lambda: None}
# "unhooked" is plain again (the A/A: what order and the machine alone move a
# ratio); "no-serve" installs without a server (install(serve=False)).


def one(variant: str, steps: int) -> dict[str, float]:
    """One process's loop: its median steps/s over five timed blocks."""
    if variant not in ("plain", "unhooked"):
        import metrics

        metrics.install(serve=variant != "no-serve")
        VARIANTS[variant]()
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    data = rng.integers(0, V, size=(4096, T + 1)).astype(np.int32)
    params = {k: jax.numpy.asarray(rng.normal(size=s).astype(np.float32) * 0.02)
              for k, s in (("emb", (V, D)), ("w", (D, D)), ("out", (D, V)))}

    def loss_fn(p, x, y):  # type: ignore[no-untyped-def]
        h = jax.numpy.tanh(p["emb"][x] @ p["w"])
        lp = jax.nn.log_softmax(h @ p["out"])
        return -jax.numpy.mean(jax.numpy.take_along_axis(lp, y[..., None], -1))

    @jax.jit
    def step(p, x, y, lr):  # type: ignore[no-untyped-def]
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, b: a - lr * b, p, g), loss

    def run(n: int, start: int) -> object:
        nonlocal params
        loss = None
        for i in range(n):
            j = (start + i) * B % (4096 - B)
            params, loss = step(params, data[j:j + B, :-1], data[j:j + B, 1:], 0.01)
        return loss

    jax.block_until_ready(run(300, 0))  # compiles and the chip's start-up outside the timing
    rates = []
    for k in range(5):
        t = time.perf_counter()
        jax.block_until_ready(run(steps // 5, 1000 + k * steps))
        rates.append((steps // 5) / (time.perf_counter() - t))
    return {"steps_per_s": median(rates), "backend": jax.default_backend()}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--one", choices=("plain", *VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--variants", default="hooked",
                   help=f"hooked variants to alternate with plain: {', '.join(VARIANTS)}")
    a = p.parse_args()
    if a.smoke:
        a.pairs, a.steps = 1, 200
    if a.one:
        print(json.dumps(one(a.one, a.steps)), flush=True)
        return
    variants = a.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"unknown variant {unknown[0]!r}: choose from {', '.join(VARIANTS)}")
    ratios: dict[str, list[float]] = {v: [] for v in variants}
    order = random.Random(0)
    for _ in range(a.pairs):
        got = {}
        modes = ["plain", *variants]
        order.shuffle(modes)  # no variant always runs first (or just after another's exit)
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--one", mode, "--steps",
                                  str(a.steps)], capture_output=True, text=True, timeout=300)
            got[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        plain = got["plain"]["steps_per_s"]
        row = []
        for v in variants:
            ratios[v].append(got[v]["steps_per_s"] / plain)
            row.append(f"{v} {ratios[v][-1]:.3f}")
        print(f"plain {plain:.0f}/s  " + "  ".join(row) + f"  ({got['plain']['backend']})",
              flush=True)
    for v in variants:
        print(f"tpu_hostbound {v} / plain, median of {len(ratios[v])} pairs: "
              f"{median(ratios[v]):.3f} (range {min(ratios[v]):.3f}-{max(ratios[v]):.3f}; "
              f"target >= 0.99)")


if __name__ == "__main__":
    main()
