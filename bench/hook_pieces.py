"""What each piece of a per-call hook costs inside a JAX training loop.

    python bench/hook_pieces.py [--smoke] [--rounds N]

A hook's C calls cost many times more between XLA's work than in a tight
loop (the hook's code and data are cold again at each call), so a piece is
measured where it runs: the tiny MLP loop of :mod:`overhead_jax` (~0.24 ms a
step, two numpy ``device_put``s), its step jitted before install, with one
variant of the numpy shard handler (which every put runs) at a time, in
alternating 100-step blocks (300 rounds, random order). Printed: each
variant's steps/s over JAX's own handler, with a 95 % bootstrap interval,
and the microseconds per put that makes:

* bare: a pass-through wrapper (a Python frame);
* transfer state: reads JAX's thread-local ``explicit_device_put``;
* journal write: one ``extend`` of a record, the array's ``nbytes``, ``len``;
* caller frame: ``sys._getframe(1).f_code`` (a frame check's price);
* the hook: the installed handler (untimed on 15 of 16 puts).

Then the same for the ``jax.jit`` wrapper, JAX's own handler in place: the
step unhooked, through a bare pass-through Python wrapper, and through the
installed one.

Two verdicts, informational: each hook's ratio.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from _common import median, parser, pooled_interval, verdict  # noqa: E402
from overhead_jax import (  # noqa: E402
    _set_shard_handlers,
    _shard_handlers,
    loop_data,
    make_step,
    run,
)

import metrics  # noqa: E402


def variants(original):  # type: ignore[no-untyped-def]
    """Shard handlers, each adding one piece to a pass-through of ``original``."""
    from jax._src.lib import guard_lib

    state, getframe, journal = guard_lib.thread_local_state, sys._getframe, []

    def bare(xs, shardings, layouts, copy_semantics):  # type: ignore[no-untyped-def]
        return original(xs, shardings, layouts, copy_semantics)

    def transfer_state(xs, shardings, layouts, copy_semantics):  # type: ignore[no-untyped-def]
        if state().explicit_device_put:
            pass
        return original(xs, shardings, layouts, copy_semantics)

    def journal_write(xs, shardings, layouts, copy_semantics):  # type: ignore[no-untyped-def]
        out = original(xs, shardings, layouts, copy_semantics)
        journal.extend((True, 0, 0, xs[0].nbytes if len(xs) == 1 else 0))
        if len(journal) > 40_000:
            journal.clear()
        return out

    def caller_frame(xs, shardings, layouts, copy_semantics):  # type: ignore[no-untyped-def]
        if getframe(1).f_code is None:
            pass
        return original(xs, shardings, layouts, copy_semantics)

    return {"bare": bare, "transfer state": transfer_state, "journal write": journal_write,
            "caller frame": caller_frame}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    rounds = 4 if args.smoke else args.rounds
    batches, params = loop_data("tiny")
    step = make_step()  # jitted before install: only the handler differs
    original_put = jax.device_put
    run(step, params, batches[:20], False, original_put)
    metrics.install(engines=["jax"], serve=False)
    hooked, own = _shard_handlers()
    if not hooked:
        print("the numpy shard handler is not hooked here: nothing to measure")
        return 1
    pieces = variants(next(iter(own.values())))
    handlers = {"JAX's own": own, **{k: dict.fromkeys(own, h) for k, h in pieces.items()},
                "the hook": hooked}
    puts = {name: jax.device_put if name == "the hook" else original_put for name in handlers}
    for name, h in handlers.items():  # each past its first calls (the hook times its first 64)
        _set_shard_handlers(h)
        run(step, params, batches, False, puts[name])
    load = os.getloadavg()[0]

    def with_handler(name: str) -> float:
        _set_shard_handlers(handlers[name])
        return run(step, params, batches, False, puts[name])[0]

    got = alternate(list(handlers), rounds, 3, with_handler)
    calls = jit_pieces(step, params, batches, rounds, own, original_put)
    _set_shard_handlers(hooked)
    metrics.uninstall()
    print(f"tiny loop, {rounds} rounds of 100 steps; load average {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f}")
    report("the numpy device_put hook", got, "JAX's own", 2)
    hook_ratio = median([a / b for a, b in zip(got["the hook"], got["JAX's own"], strict=True)])
    verdict("hook_pieces the numpy device_put hook in the tiny loop (with/without)", hook_ratio,
            "informational", True)
    report("the jax.jit wrapper", calls, "unhooked", 1)
    r = median([a / b for a, b in zip(calls["the wrapper"], calls["unhooked"], strict=True)])
    verdict("hook_pieces the jax.jit wrapper in the tiny loop (with/without)", r,
            "informational", True)
    return 0


def jit_pieces(step, params, batches, rounds, own, put):  # type: ignore[no-untyped-def]
    """Steps/s of the tiny loop per jit wrapper variant, JAX's own handler and
    ``put`` (JAX's own ``device_put``) in place."""
    from metrics.engines.jax import calls as jax_calls
    from metrics.engines.jax.context import CONTEXT

    plain = step

    def bare(*args, **kwargs):  # type: ignore[no-untyped-def]
        return plain(*args, **kwargs)

    installed = jax_calls.counting(plain, jax_calls.Owner("jit(step)"), CONTEXT)
    steps = {"unhooked": plain, "bare": bare, "the wrapper": installed}
    _set_shard_handlers(own)
    for fn in steps.values():  # past their first calls (the wrapper times its first 64)
        run(fn, params, batches, False, put)
    return alternate(list(steps), rounds, 4,
                     lambda name: run(steps[name], params, batches, False, put)[0])


def alternate(names: list[str], rounds: int, seed: int,
              one: Callable[[str], float]) -> dict[str, list[float]]:
    """``one(name)`` of every name per round, in a random order each round
    (the same every run): many short alternating blocks, since this VM's
    speed drifts within seconds."""
    got: dict[str, list[float]] = {k: [] for k in names}
    order = random.Random(seed)
    for _ in range(rounds):
        shuffled = list(names)
        order.shuffle(shuffled)
        for name in shuffled:
            got[name].append(one(name))
    return got


def report(what: str, got: dict[str, list[float]], base: str, per_step: int) -> None:
    """Each variant's steps/s over ``base``'s, and the us per call that makes."""
    base_us = 1e6 / median(got[base])
    print(f"{what}: {base_us:.0f} us a step with {base}, {per_step} call(s) a step")
    for name in got:
        if name == base:
            continue
        r = [a / b for a, b in zip(got[name], got[base], strict=True)]
        m = median(r)
        interval = f", 95 % interval {pooled_interval([r])}" if len(r) > 1 else ""
        print(f"  {name}: {m:.4f} of {base}{interval}; ~{(1 / m - 1) * base_us / per_step:+.2f} "
              f"us a call")


if __name__ == "__main__":
    raise SystemExit(main())
