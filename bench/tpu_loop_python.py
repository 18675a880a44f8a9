"""What a few Python operations cost inside a host-bound loop on the chip, against
the same operations alone (issue 40): no hook at all, so it isolates the machine.

    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_loop_python.py [--rounds 60]

The loop is ``overhead_jax``'s "hostbound" (a jitted MLP step fed two numpy
slices and a Python float: ~0.56 ms a step on a TPU v5e, the host the
bottleneck). Before each step it runs one variant, in one process, variants
alternated in 100-step blocks; it prints each variant's step, its added time
and the median ratio plain / variant, and the variant's cost alone (a tight
loop). On the chip (2026-12-06): two 8-field records a call (what the hook
wrote per numpy argument) cost 0.8 us alone and +6 to +9 us a step in the
loop (ratio 0.979-0.984); counting the call in place on one object (what
``metrics.engines.jax.numpy_runs`` does) 0.992-0.994; finding the caller's
frame alone 0.995-0.997; a clock read 1.001.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

import numpy as np
from _common import median, parser

os.environ.setdefault("JAX_PLATFORMS", "tpu")
ND = np.ndarray
LABEL = "numpy argument of jit(step)"
_queue: list[Any] = []


class _Run:
    __slots__ = ("code", "lasti", "n", "last", "bytes")

    def __init__(self) -> None:
        self.code, self.lasti, self.n, self.last, self.bytes = None, 0, 0, 0, 0


_run = _Run()


def records(args: tuple[Any, ...]) -> None:
    """Two 8-field records a call, as the hook wrote before numpy_runs."""
    f = sys._getframe(1)
    code, lasti, now = f.f_code, f.f_lasti, time.monotonic_ns()
    for a in args:
        if type(a) is ND:
            _queue.extend((1, code, lasti, LABEL, now, now, a.nbytes, now))
    if len(_queue) >= 4096:
        del _queue[:4096]


def counted(args: tuple[Any, ...]) -> None:
    """The call counted in place on one object (numpy_runs' usual path)."""
    f = sys._getframe(1)
    if f.f_code is _run.code and f.f_lasti == _run.lasti:
        _run.n += 1
        _run.last = time.monotonic_ns()
        for a in args:
            if type(a) is ND:
                _run.bytes += a.nbytes
    else:
        _run.code, _run.lasti = f.f_code, f.f_lasti


def frame(args: tuple[Any, ...]) -> None:
    f = sys._getframe(1)
    f.f_code, f.f_lasti  # noqa: B018


def clock(args: tuple[Any, ...]) -> None:
    time.monotonic_ns()


VARIANTS = {"records": records, "counted": counted, "frame": frame, "clock": clock}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=60)
    a = p.parse_args()
    rounds = 3 if a.smoke else a.rounds
    import jax
    import overhead_jax as o

    batches, params = o.loop_data("hostbound", 100)
    step = o.make_step(True)

    def run(kind: str) -> float:
        fn, p, lr = VARIANTS.get(kind), params, o.LR
        t0 = time.perf_counter()
        if fn is None:
            for x, y in batches:
                p, loss = step(p, x, y, lr)
        else:
            for x, y in batches:
                fn((p, x, y, lr))
                p, loss = step(p, x, y, lr)
        jax.block_until_ready(loss)
        return (time.perf_counter() - t0) / len(batches) * 1e6

    kinds = ["plain", *VARIANTS]
    for k in kinds:
        run(k)
    got: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for k in random.Random(r).sample(kinds, len(kinds)):
            got[k].append(run(k))
    base = median(got["plain"])
    args = (params, batches[0][0], batches[0][1], 0.01)
    for k in kinds:
        ratio = median([p / h for p, h in zip(got["plain"], got[k])])
        alone = ""
        if k in VARIANTS:
            t = time.perf_counter_ns()
            for _ in range(20_000):
                VARIANTS[k](args)
            alone = f", alone {(time.perf_counter_ns() - t) / 2e4 / 1e3:.2f} us"
        print(f"tpu_loop_python {k}: {median(got[k]):.1f} us/step "
              f"(+{median(got[k]) - base:.1f}), plain / it {ratio:.3f}{alone} "
              f"[{rounds} rounds on {jax.default_backend()}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
