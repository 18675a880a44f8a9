"""How late ``block_until_ready`` sees a completion, no hook (issue 40/41).

The hook's device-time watcher waits on a sampled call's output with
``block_until_ready`` and reads the clock when it returns. On the TPU v5e
under gVisor that return came ~650 us after the device finished: an idle
chip's 31 us graph read 652 us from its call's return, while two executions
queued back to back completed 31 and 702 us apart. This prints, for a small
and a larger graph on an idle device:

- ``from return``: the call's return to ``block_until_ready`` returning, on
  the calling thread and on a waiting thread (the watcher's way);
- ``back to back``: the second of two queued executions' completion less the
  first's (both lags cancel: the device's own time);
- ``ready read``: ``float()`` of a scalar that is already on the device and
  ready (the read latency the hook measures and takes off a span from the
  call's return: metrics/engines/jax/device_time.py).

Run on the TPU machine (``reference/tpu-machine.md``)::

    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_wakeup_lag.py
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time


def _us(ns: float) -> str:
    return f"{ns / 1e3:8.1f} us"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--sizes", default="128,2048", help="square matmul sizes, comma-separated")
    a = p.parse_args()
    import jax
    import jax.numpy as jnp

    print(f"backend {jax.default_backend()}, devices {jax.devices()}")
    for n in (int(x) for x in a.sizes.split(",")):
        @jax.jit
        def graph(x):
            return jnp.tanh(x @ x).sum()

        x = jnp.ones((n, n), jnp.float32) / n
        graph(x).block_until_ready()  # compile
        direct, watched, queued, ready = [], [], [], []
        for _ in range(a.rounds):
            time.sleep(0.002)  # an idle device
            out = graph(x)
            t0 = time.perf_counter_ns()
            out.block_until_ready()
            direct.append(time.perf_counter_ns() - t0)

            seen: list = []  # [array] in, then [array, completion ns]: a waiting watcher
            given = threading.Event()

            def watch(seen: list = seen, given: threading.Event = given) -> None:
                given.wait()
                seen[0].block_until_ready()
                seen.append(time.perf_counter_ns())

            w = threading.Thread(target=watch)
            w.start()
            time.sleep(0.002)
            seen.append(graph(x))
            t0 = time.perf_counter_ns()
            given.set()
            w.join()
            watched.append(seen[1] - t0)

            time.sleep(0.002)
            first, second = graph(x), graph(x)
            first.block_until_ready()
            t1 = time.perf_counter_ns()
            second.block_until_ready()
            queued.append(time.perf_counter_ns() - t1)

            t0 = time.perf_counter_ns()
            float(out)  # ready: its own latency  (out was waited on above)
            ready.append(time.perf_counter_ns() - t0)
        med = statistics.median
        print(f"{n:5d}x{n:<5d} from return {_us(med(direct))}   from a thread "
              f"{_us(med(watched))}   back to back {_us(med(queued))}   "
              f"ready read {_us(med(ready))}")


if __name__ == "__main__":
    main()
