"""Cost of recording: ns per counter increment and per distribution sample,
against prometheus_client's Counter.inc and Histogram.observe, same process.

    python bench/record_cost.py [--smoke]

Targets: ratio <= 1.0 for both; the goal is <= 0.5.
"""

from __future__ import annotations

import random
import timeit

import numpy  # noqa: F401 - loaded in every JAX/PyTorch program; the fold uses it
import prometheus_client as prom
from _common import median, parser, verdict

from metrics.recording.registry import Counter, Distribution


def main() -> int:
    args = parser(__doc__).parse_args()
    n = 20_000 if args.smoke else 200_000
    rounds = 3 if args.smoke else 9
    reg = prom.CollectorRegistry()
    p_counter = prom.Counter("bench_c", "c", registry=reg)
    p_hist = prom.Histogram("bench_h", "h", registry=reg)
    counter = Counter("c")
    dist = Distribution("d")
    # Realistic samples: compile/transfer times in ns spread over decades.
    values = [random.lognormvariate(11, 2) for _ in range(1024)]
    seconds = [v / 1e9 for v in values]

    def ours_obs() -> None:
        for v in values:
            dist.observe(v)

    def prom_obs() -> None:
        for v in seconds:
            p_hist.observe(v)

    c_ratios, d_ratios, c_abs, d_abs = [], [], [], []
    reps = max(1, n // len(values))
    for _ in range(rounds):
        ours_c = timeit.timeit(counter.inc, number=n) / n
        prom_c = timeit.timeit(p_counter.inc, number=n) / n
        ours_d = timeit.timeit(ours_obs, number=reps) / (reps * len(values))
        prom_d = timeit.timeit(prom_obs, number=reps) / (reps * len(values))
        c_ratios.append(ours_c / prom_c)
        d_ratios.append(ours_d / prom_d)
        c_abs.append((ours_c * 1e9, prom_c * 1e9))
        d_abs.append((ours_d * 1e9, prom_d * 1e9))
    print(f"counter inc:   ours {median([a for a, _ in c_abs]):.0f} ns, "
          f"prometheus_client {median([b for _, b in c_abs]):.0f} ns")
    print(f"distribution:  ours {median([a for a, _ in d_abs]):.0f} ns, "
          f"prometheus_client Histogram {median([b for _, b in d_abs]):.0f} ns")
    c = median(c_ratios)
    d = median(d_ratios)
    verdict("record_cost counter ratio", c, "<= 1.0, goal 0.5", c <= 1.0)
    verdict("record_cost distribution ratio", d, "<= 1.0, goal 0.5", d <= 1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
