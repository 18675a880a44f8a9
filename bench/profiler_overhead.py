"""Cost of profiler annotations: ``with profiler.Trace(name)`` per second with
no capture running and during a capture, against an empty context manager
(``contextlib.nullcontext``), same run, alternating rounds.

    python bench/profiler_overhead.py [--smoke]

Targets: no capture <= 2.0x the empty context manager; during a capture
<= 6.0x (each entry and exit appends one record).
"""

from __future__ import annotations

import contextlib
import threading
import time

from _common import median, parser, verdict

import profiler
from profiler.annotations import recording
from profiler.capture import Capture


def _rate(cm: type, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        with cm("step"):
            pass
    return n / (time.perf_counter() - start)


def main() -> int:
    args = parser(__doc__).parse_args()
    n = 20_000 if args.smoke else 200_000
    rounds = 3 if args.smoke else 9
    empty_rates, idle_rates, busy_rates = [], [], []
    idle_ratios, busy_ratios = [], []
    _rate(profiler.Trace, 1000)  # warm up
    for _ in range(rounds):
        empty = _rate(contextlib.nullcontext, n)
        idle = _rate(profiler.Trace, n)
        capture = Capture(60, max_annotations=2 * n + 10)
        stop = threading.Event()
        worker = threading.Thread(target=capture.run, args=(stop,))
        worker.start()
        while not recording():
            time.sleep(0.001)
        busy = _rate(profiler.Trace, n)
        stop.set()
        worker.join()
        empty_rates.append(empty)
        idle_rates.append(idle)
        busy_rates.append(busy)
        idle_ratios.append(empty / idle)
        busy_ratios.append(empty / busy)
    print(f"annotations/s: empty context manager {median(empty_rates) / 1e6:.2f} M, "
          f"Trace with no capture {median(idle_rates) / 1e6:.2f} M, "
          f"Trace during a capture {median(busy_rates) / 1e6:.2f} M")
    idle_ratio = median(idle_ratios)
    busy_ratio = median(busy_ratios)
    ok = [verdict("profiler_overhead idle/empty time ratio", idle_ratio, "<= 2.0",
                  idle_ratio <= 2.0),
          verdict("profiler_overhead capturing/empty time ratio", busy_ratio, "<= 6.0",
                  busy_ratio <= 6.0)]
    return 0 if args.smoke or all("OK" in line for line in ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
