"""What the hook costs a compile-heavy JAX program (a new shape every call).

    python bench/compile_heavy.py [--smoke]

One jitted function called with a new input shape on every call, so every
call traces, lowers and compiles. Two variants: "fresh" (a new function each
block, so it has only the block's variants) and "200 prior" (one function
that compiled 200 variants before the timing starts and keeps growing).
Blocks without and with the hook (``metrics.install`` before the block,
``metrics.uninstall`` after it) alternate in one run, in a random order per
pair; printed: the median over pairs of calls/s with / without. Target
>= 0.95: recompile causes must not make compiling slower than it is.
"""

from __future__ import annotations

import os
import random
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import median, parser, verdict  # noqa: E402

import metrics  # noqa: E402

_next_rows = [0]  # every call in the run gets a shape never seen before


def make_fn():  # type: ignore[no-untyped-def]
    """A new jitted function (its own tracing-cache entries)."""
    def step(x):  # type: ignore[no-untyped-def]
        return jnp.tanh(x) * 2.0 + 1.0

    return jax.jit(step)


def block(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    """Calls per second over ``calls`` calls, each with a new shape."""
    start = time.perf_counter()
    for _ in range(calls):
        _next_rows[0] += 1
        fn(np.zeros((_next_rows[0], 8), np.float32)).block_until_ready()
    return calls / (time.perf_counter() - start)


def measure(label: str, prior: int, rounds: int, calls: int) -> float:
    shared = make_fn() if prior else None
    if shared is not None:
        block(shared, prior)
    rng = random.Random(3)
    ratios, without, with_ = [], [], []
    for _ in range(rounds):
        got = {}
        for hooked in ((False, True) if rng.random() < 0.5 else (True, False)):
            fn = shared if shared is not None else make_fn()
            if hooked:
                metrics.install(engines=["jax"], serve=False)
            try:
                got[hooked] = block(fn, calls)
            finally:
                if hooked:
                    metrics.uninstall()
        without.append(got[False])
        with_.append(got[True])
        ratios.append(got[True] / got[False])
    load = os.getloadavg()[0]
    print(f"[{label}] calls/s without hook {median(without):.1f}, with hook {median(with_):.1f} "
          f"({calls} calls x {rounds} rounds, {1e3 / median(without):.1f} ms per compile; "
          f"load average {load:.2f})")
    r = median(ratios)
    verdict(f"compile_heavy {label} calls/s ratio (with/without)", r, ">= 0.95", r >= 0.95)
    return r


def main() -> int:
    args = parser(__doc__).parse_args()
    rounds, calls, prior = (2, 4, 10) if args.smoke else (8, 12, 200)
    make_fn()(np.zeros((1, 1), np.float32))  # JAX's own first-use costs, outside the timing
    metrics.install(engines=["jax"], serve=False)  # and the hook's
    metrics.uninstall()
    measure("fresh", 0, rounds, calls)
    measure(f"{prior} prior", prior, rounds, calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
