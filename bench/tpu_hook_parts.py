"""Which part of the hook costs a host-bound loop on the chip: one process, the
loop's step jitted before install (unhooked) and after (hooked), alternated
in short blocks; ``--off`` switches parts of the hook off (issue 40).

    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_hook_parts.py [--off numpy,untimed]

The loop is ``overhead_jax``'s "hostbound" (mnist's MLP, two numpy slices and a
Python float straight into the jitted step: ~0.56 ms a step on a TPU v5e, where
the host is the bottleneck). One process, so no process-to-process noise (the
A/A of ``tpu_hostbound.py`` spans 0.99-1.02; here a few tenths of a percent).
It prints the median over rounds of hooked / unhooked steps/s. The parts
(:data:`PARTS`), each measured on the chip at 66e94ff (40-50 rounds):
all on 0.967-0.969; ``numpy`` and ``precopy`` off 0.993; ``precopy`` off 0.961;
all of ``untimed,numpy,offer,gaps,gc`` off 0.996; the wrapper alone 1.000.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
from typing import Any

from _common import median, parser

os.environ.setdefault("JAX_PLATFORMS", "tpu")


def _writer_frame_only(*_: Any) -> Any:
    """The numpy-argument writer that finds the caller's frame and stops."""
    import sys as _sys

    def write(owner: Any, args: Any, depth: int) -> None:
        f = _sys._getframe(depth)
        owner.numpy_args = True
        f.f_code, f.f_lasti  # noqa: B018 - what the real writer reads
    return write


def _bare(fn: Any, count: bool) -> Any:
    """``fn`` under the least Python wrapper (and a count on an object)."""
    class Box:
        calls = 0
    box = Box()

    def bare(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def counted(*args: Any, **kwargs: Any) -> Any:
        box.calls += 1
        return fn(*args, **kwargs)
    return counted if count else bare


def _lean(wrapper: Any) -> Any:
    """The hook's wrapper on one call in 16; the others straight to the jitted
    function, counted on its owner: the least an untimed call could do."""
    from metrics.engines.jax.context import CONTEXT
    jitted = wrapper._tpu_info_jitted
    owner = next(o for d in CONTEXT.owners.values() for o in d.values() if o.calls)
    n = [0]

    def lean(*args: Any) -> Any:
        n[0] += 1
        if n[0] & 15:
            owner.calls += 1
            return jitted(*args)
        return wrapper(*args)
    return lean


# Part -> what switching it off does (applied before install unless said).
PARTS = {
    "numpy": "no record of numpy arguments (JitArguments' writer does nothing)",
    "write-frame": "the numpy writer finds the caller's frame, writes nothing",
    "precopy": "no pre-put copy samples (COPY_SPACING_NS past the first)",
    "precopy-50ms": "pre-put copy samples one every 50 ms past the first (as before 1 s)",
    "untimed": "no timed calls past the first 64",
    "offer": "no device-time samples",
    "gaps": "no gap bookkeeping at a call after other work",
    "gc": "the garbage collector off (both contenders)",
    "switch": "GIL hand-offs 100x rarer (sys.setswitchinterval 0.5 s, both contenders)",
    "wrapper": "the jitted function called past the hook's wrapper",
    "bare": "the jitted function under a bare Python wrapper (*args, **kwargs), no hook",
    "count": "a bare Python wrapper that counts each call on an object",
    "host_lines": "no sampled host-line intervals (HostLines.after_step does nothing)",
    "dispatch-wait": "no getrusage around the step's sampled calls (DispatchWaitTime)",
    "noqueue": "no call records kept (the calls journal's queue a deque of length 0)",
    "lean": "15 calls in 16 counted on the owner past the wrapper, the 16th through it",
    "per-second": "no work spaced in time past the first (thread samples, pre-put copies, "
                  "device-time samples and read probes, dispatch waits)",
    "sparse": "one call in 64 timed past the first 64 (not 16)",
}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--off", default="", help=f"parts off, comma-separated: {', '.join(PARTS)}")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--size", default="hostbound",
                   help="overhead_jax's loop: hostbound (numpy and a float into the step) or "
                        "mnist (each batch jax.device_put first)")
    p.add_argument("--read", action="store_true",
                   help="both loops read the loss every step (float(loss)); the unhooked "
                        "one with JAX's own read, the hooked one through the hook's")
    a = p.parse_args()
    off = {x for x in a.off.split(",") if x}
    if unknown := off - set(PARTS):
        p.error(f"unknown part {sorted(unknown)[0]!r}: choose from {', '.join(PARTS)}")
    rounds = 3 if a.smoke else a.rounds
    import jax  # noqa: F401 - before overhead_jax, which sets the platform default
    import overhead_jax as o

    import metrics
    from metrics.engines.jax import calls, device_time, host_lines, numpy_runs

    raw = a.size in o.FED_RAW
    put = None if raw else jax.device_put
    batches, params = o.loop_data(a.size, 100)
    plain = o.make_step(raw)
    o.run(plain, params, batches[:20], False, put)
    if "untimed" in off:
        calls.counting.__defaults__ = (1 << 62, 64)
    if "precopy" in off:
        calls.COPIES_FIRST, calls.COPY_SPACING_NS = 0, 1 << 62
    if "precopy-50ms" in off:
        calls.COPY_SPACING_NS = 50_000_000
    if "numpy" in off:
        numpy_runs.writer = lambda *_: (lambda *__: None)
    elif "write-frame" in off:
        numpy_runs.writer = _writer_frame_only
    if "host_lines" in off:
        host_lines.HostLines.after_step = lambda *_: None  # type: ignore[method-assign]
    if "dispatch-wait" in off:
        calls.WAIT_AFTER = 1 << 62
    if "sparse" in off:
        calls.counting.__defaults__ = (64, 64)
    if "per-second" in off:
        from metrics.recording import thread_busy
        far = 1 << 62
        thread_busy.SPACING_NS = thread_busy.WAIT_SPACING_NS = far
        calls.COPY_SPACING_NS = device_time.LATER_SPACING_NS = device_time.PROBE_SPACING_NS = far
    metrics.install(engines=["jax"], serve=False)
    if "offer" in off:
        device_time.DeviceTimes.offer = lambda *_, **__: None  # type: ignore[method-assign]
    if "gaps" in off:
        calls.at_call = lambda *_: None
    if "gc" in off:
        gc.disable()
    if "switch" in off:
        sys.setswitchinterval(0.5)
    hooked = o.make_step(raw)
    o.run(hooked, params, batches[:20], False, jax.device_put if put else None)
    if off & {"wrapper", "bare", "count"}:
        hooked = getattr(hooked, "_tpu_info_jitted", hooked)
    if off & {"bare", "count"}:
        hooked = _bare(hooked, "count" in off)
    if "noqueue" in off:
        import collections

        from metrics.engines.jax.context import CONTEXT
        eng = CONTEXT.active
        eng.calls_queue = collections.deque(maxlen=0)  # type: ignore[union-attr]
    if "lean" in off:
        hooked = _lean(hooked)
    from jax._src.array import ArrayImpl
    hooked_read = ArrayImpl.__dict__["_value"]
    reads = {"hooked": hooked_read, "plain": property(hooked_read.fget.__wrapped__)}
    order = random.Random(1)
    got: dict[str, list[float]] = {"plain": [], "hooked": []}
    for _ in range(rounds):
        for k in order.sample(list(got), 2):
            ArrayImpl._value = reads[k]  # (jax's own read for the unhooked loop)
            got[k].append(o.run(plain if k == "plain" else hooked, params, batches, False,
                                (jax.device_put if k == "hooked" else put) if put else None,
                                read=a.read)[0])
    ArrayImpl._value = hooked_read
    ratio = median([h / u for h, u in zip(got["hooked"], got["plain"])])
    print(f"tpu_hook_parts off={','.join(sorted(off)) or 'none'}"
          f"{' (a read every step)' if a.read else ''}: hooked / unhooked "
          f"{ratio:.3f} (unhooked {1e6 / median(got['plain']):.0f} us/step, hooked "
          f"{1e6 / median(got['hooked']):.0f}; {rounds} rounds on {jax.default_backend()}; "
          f"threads {sorted(t.name for t in threading.enumerate())})")
    metrics.uninstall()


if __name__ == "__main__":
    sys.exit(main())
