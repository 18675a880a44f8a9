"""Overhead of the hook on a small JAX MLP training loop (CPU), every hook on.

    python bench/overhead_jax.py [--smoke] [--size tiny|mnist|hostbound|all]
                                 [--rounds N] [--processes K]

Alternates short runs of six contenders (400 rounds of 100-step blocks in
all by default, ``--rounds N``, a random order per round; every step well
under a millisecond), shared among four fresh processes run one after
another (``--processes K``: a process's memory layout biases its figures by
up to ~1 % here, so one process reports one draw of that bias), and prints
the median over all rounds of each one's steps/s over the unhooked run's,
with each process's median and a 95 % interval that resamples processes
and then rounds, for two MLPs: "tiny" (~0.13 ms per step on a quiet
machine) and "mnist" (784-128-10, batch 32, ~0.25 ms), each batch put with
``jax.device_put``; and "hostbound": mnist's MLP fed the way a host-bound
loop often is (a small LM on a TPU chip, 0.6 ms a step, fed this way ran at
0.975-0.984 of unhooked): two numpy slices of one array and a Python float
straight into the jitted step, no ``device_put`` (JAX copies them in C++;
the ``jax.jit`` wrapper counts each numpy argument). The contenders:

* without: the step jitted before install, the original ``jax.device_put``
  and jax's own numpy shard handler (the hook patches it process-wide);
* bare wrapper: the same, each call (the step, both device_puts) through a
  bare pass-through Python wrapper: the floor any Python hook pays there;
* loop unchanged: what a program with ``metrics.install()`` at its top gets,
  every hook on: the step jitted after install (each call counted by the
  ``jax.jit`` wrapper), ``jax.device_put`` counted (by the numpy shard
  handler, the one hook a put runs), the implicit transfer and
  sync hooks and recompile causes installed; both hooks time their first
  64 calls and then one in 16 (``metrics.recording.sampling``). Target >= 0.99 on "mnist"
  and "hostbound" (there each numpy argument is also an implicit transfer,
  written at the caller's line: ``metrics.engines.jax.jit_numpy``);
  "tiny" is reported against the bare-wrapper floor (target >= 0.99 of it);
* jitted before install: the same loop, its step jitted before install
  (only the transfers counted);
* tracked: the explicit path, the step wrapped in ``metrics.track`` and
  ``metrics.mark_step()`` every step (target >= 0.99 on "mnist").
* without, again: "without" under a second name; its ratio to "without"
  is what this machine reads for no difference at all (the A/A control:
  a ratio between the others closer to 1 than it is noise).

A 95 % bootstrap interval of each median tells a miss from this machine's
noise; the load average is printed before and after. Each ratio is also
given per CPU second of the process and of the training thread (where every
hook runs: the waits for a core on a shared machine are not in it), and the
hooks' work in one step is counted (Python frames, opcodes and C calls in
``metrics/``: the same on any load). On a loaded machine a 1 % difference
is inside the noise of all three clocks; ``bench/overhead_instructions.py``
counts the same contenders in instructions under valgrind.

Per call, in alternating blocks (where the hook's share is largest): a
trivial jitted function, ``float(x)`` of a ready scalar, ``jnp.asarray``
of a 4 KB numpy batch and ``jax.device_put`` of the MNIST batch (counted in
the numpy shard handler: one hook per put), each unhooked, through a bare
pass-through Python wrapper in the hook's place, and hooked; target: hooked <= 1.5x the bare
wrapper, judged on this process's CPU time per call (the hook's cost is CPU
work; on a shared machine wall time is mostly the wait for a core); wall
time is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import in_processes, median, parser, pooled_rates, ratio_rows, verdict  # noqa: E402

import metrics  # noqa: E402

# (batch, inputs, hidden, outputs): "tiny" is ~0.1 ms per step on this CPU,
# where any Python in the loop shows (even an empty call measures ~1 % here);
# "mnist" is the tutorial MNIST MLP (784-128-10, batch 32), ~0.25 ms per step;
# "hostbound" the same MLP, its batches numpy slices passed to the step as they
# are, with a Python float (FED_RAW).
SIZES = {"tiny": (64, 32, 256, 1), "mnist": (32, 784, 128, 10),
         "hostbound": (32, 784, 128, 10)}
FED_RAW = ("hostbound",)  # sizes whose step takes numpy and a Python float, no device_put
LR = 0.01


def make_step(raw: bool = False):  # type: ignore[no-untyped-def]
    """The jitted training step: ``step(params, x, y)``, or with ``raw``
    ``step(params, x, y, lr)`` (numpy batches, a Python float learning rate)."""
    def loss_fn(params, x, y):  # type: ignore[no-untyped-def]
        (w1, b1), (w2, b2) = params
        h = jnp.tanh(x @ w1 + b1)
        return jnp.mean((h @ w2 + b2 - y) ** 2)

    if raw:
        @jax.jit
        def step(params, x, y, lr):  # type: ignore[no-untyped-def]
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            new = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
            return new, loss

        return step

    @jax.jit
    def step(params, x, y):  # type: ignore[no-untyped-def]  # noqa: F811
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        new = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
        return new, loss

    return step


def loop_data(size: str, steps: int = 100):  # type: ignore[no-untyped-def]
    """(numpy batches for ``steps`` steps, the MLP's parameters) of one size;
    a FED_RAW size's batches are slices (views) of one array, as a loop
    that indexes its dataset makes them."""
    batch, n_in, hidden, n_out = SIZES[size]
    rng = np.random.default_rng(0)
    if size in FED_RAW:
        data = rng.standard_normal((batch * steps + 1, n_in + n_out), dtype=np.float32)
        batches = [(data[i * batch:(i + 1) * batch, :n_in], data[i * batch:(i + 1) * batch, n_in:])
                   for i in range(steps)]
    else:
        batches = [(rng.standard_normal((batch, n_in), dtype=np.float32),
                    rng.standard_normal((batch, n_out), dtype=np.float32)) for _ in range(steps)]
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = ((jax.random.normal(k1, (n_in, hidden)) * 0.1, jnp.zeros(hidden)),
              (jax.random.normal(k2, (hidden, n_out)) * 0.1, jnp.zeros(n_out)))
    return batches, params


def run(step, params, batches, mark: bool, put,  # type: ignore[no-untyped-def]
        read: bool = False) -> tuple[float, float, float]:
    """(steps per wall second, per CPU second of this process, per CPU
    second of this thread: the training thread, where every hook runs);
    ``put`` None: the batches and a Python float go to the step as they are;
    ``read``: the loss read to the host every step (``float(loss)``)."""
    start, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    total = 0.0
    if put is None:
        for x, y in batches:
            params, loss = step(params, x, y, LR)
            if read:
                total += float(loss)
            if mark:
                metrics.mark_step()
    else:
        for x, y in batches:
            params, loss = step(params, put(x), put(y))
            if read:
                total += float(loss)
            if mark:
                metrics.mark_step()
    jax.block_until_ready(loss)
    n = len(batches)
    return (n / (time.perf_counter() - start), n / max(time.process_time() - cpu, 1e-9),
            n / max(time.thread_time() - own, 1e-9))


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--size", choices=[*SIZES, "all"], default="all")
    ap.add_argument("--rounds", type=int, default=400,
                    help="rounds of the loop contenders in all (default 400; the 95 %% "
                         "interval narrows as its square root)")
    ap.add_argument("--processes", type=int, default=4,
                    help="fresh processes the rounds are shared among, one after another "
                         "(default 4; 1: this one)")
    ap.add_argument("--collect", choices=list(SIZES), help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.collect:  # one process's share, as JSON for the parent
        print(json.dumps(collect(args.collect, args.rounds, args.seed)))
        return 0
    for size in SIZES if args.size == "all" else [args.size]:
        measure(size, args.smoke, args.rounds, args.processes)
    per_call(args.smoke)
    return 0


def per_call(smoke: bool) -> None:
    """Each hooked place three ways (unhooked, bare pass-through wrapper,
    hooked), in alternating blocks: us per call and the ratios."""
    from implicit_transfers import contenders, use

    metrics.install(engines=["jax"], serve=False)
    hooked = jax.jit(lambda x: x + 1)  # jitted after install: the hook's wrapper
    plain = getattr(hooked, "_tpu_info_jitted", hooked)  # the same jitted function, unhooked

    def bare(*args, **kwargs):  # type: ignore[no-untyped-def]
        return plain(*args, **kwargs)

    places = contenders()
    hooked_handlers, own_handlers = _shard_handlers()
    bare_handlers = {k: _bare(h) for k, h in own_handlers.items()}
    handlers = (own_handlers, bare_handlers, hooked_handlers)
    x, scalar = jnp.ones(4), jnp.float32(3.0) * 2
    batch, mnist_batch = np.ones((32, 32), np.float32), np.ones((32, 784), np.float32)
    hooked(x).block_until_ready()
    ways = ("unhooked", "bare wrapper", "hooked")
    cases = {
        "jit call": ([lambda: plain(x), lambda: bare(x), lambda: hooked(x)], None, 2000),
        "float(x)": ([lambda: float(scalar)] * 3, "value", 4000),
        "jnp.asarray(4 KB numpy)": ([lambda: jnp.asarray(batch)] * 3, "stage", 1000),
        "jax.device_put(100 KB numpy)": ([lambda: jax.device_put(mnist_batch)] * 3, "shard",
                                         500),
    }
    rounds = 3 if smoke else 40
    rng = random.Random(5)
    times = {c: {w: [] for w in ways} for c in cases}  # wall us per call
    cpu_times = {c: {w: [] for w in ways} for c in cases}  # CPU us per call (all threads)
    over_bare: dict[str, list[float]] = {c: [] for c in cases}
    load_before = os.getloadavg()[0]
    for _ in range(rounds):
        for case, (fns, place, calls) in cases.items():
            got = {}
            order = list(range(3))
            rng.shuffle(order)
            for i in order:
                if place == "shard":
                    _set_shard_handlers(handlers[i])
                elif place is not None:
                    use(places, i, only=place)
                fn, start, cpu = fns[i], time.perf_counter(), time.process_time()
                for _ in range(calls):
                    fn()
                got[ways[i]] = (time.process_time() - cpu) / calls * 1e6
                times[case][ways[i]].append((time.perf_counter() - start) / calls * 1e6)
                cpu_times[case][ways[i]].append(got[ways[i]])
            over_bare[case].append(got["hooked"] / got["bare wrapper"])
    use(places, 2)
    _set_shard_handlers(hooked_handlers)
    metrics.uninstall()
    load = os.getloadavg()[0]
    for case in cases:
        for clock, per in (("wall", times), ("CPU", cpu_times)):
            t = {w: median(v) for w, v in per[case].items()}
            print(f"[per call] {case}: {clock} us per call unhooked {t['unhooked']:.2f}, bare "
                  f"wrapper {t['bare wrapper']:.2f}, hooked {t['hooked']:.2f}; hooked / bare "
                  f"{t['hooked'] / t['bare wrapper']:.3f}, hooked / unhooked "
                  f"{t['hooked'] / t['unhooked']:.3f} ({rounds} rounds, load average "
                  f"{load_before:.2f} -> {load:.2f})")
    for case in cases:
        r = median(over_bare[case])
        verdict(f"overhead_jax per hooked {case} / bare wrapper", r, "<= 1.5", r <= 1.5)


def collect(size: str, rounds: int, seed: int = 7) -> dict[str, Any]:
    """One process's share: ``rounds`` rounds of every contender, in a random
    order per round (``seed``). Returns each contender's (steps per wall
    second, per process CPU second, per training-thread CPU second) per
    round, the executions counted, the hooks' work in a step and the load."""
    # Many short alternating blocks: this VM's speed drifts by 2x within
    # seconds, so long runs compare different machines.
    steps = 100
    batches, params = loop_data(size, steps)
    raw = size in FED_RAW
    original_put = jax.device_put
    plain = make_step(raw)
    run(plain, params, batches[:20], False, None if raw else original_put)  # compile untimed

    def bare_step(*args, **kwargs):  # type: ignore[no-untyped-def]
        return plain(*args, **kwargs)

    def bare_put(*args, **kwargs):  # type: ignore[no-untyped-def]
        return original_put(*args, **kwargs)

    put, unhooked_put, bare = ((None, None, None) if raw
                               else (jax.device_put, original_put, bare_put))

    # The program installs once: hooks stay in, and the "without" and "bare"
    # runs call the original jitted function and jax.device_put and skip
    # mark_step, so they touch no hook. (Installing and removing the hooks
    # around every block would add a first-call cost that no real program pays.)
    metrics.install(engines=["jax"], serve=False)
    jitted_after = make_step(raw)  # what a program gets with install() at its top
    tracked = metrics.track(plain)
    for fn, mark in ((jitted_after, False), (tracked, True)):
        run(fn, params, batches[:20], mark, put)  # compiles, first calls
    # The numpy shard handlers are patched process-wide (under any
    # device_put): the unhooked contenders run with jax's own in place.
    hooked_handlers, own_handlers = _shard_handlers()
    # "again" is "without" under a second name: its ratio to "without" is
    # what this machine reads for no difference at all (the A/A control).
    runs = {"without": (plain, False, unhooked_put), "again": (plain, False, unhooked_put),
            "bare": (bare_step, False, bare),
            "unchanged": (jitted_after, False, put),
            "before": (plain, False, put), "tracked": (tracked, True, put)}
    load_before = os.getloadavg()[0]
    order_rng = random.Random(seed)  # one generator: a random order per round, the same every run
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in runs}
    for _ in range(rounds):
        labels = list(runs)
        order_rng.shuffle(labels)
        for label in labels:
            fn, mark, put = runs[label]
            _set_shard_handlers(own_handlers if label in UNHOOKED else hooked_handlers)
            got[label].append(run(fn, params, batches, mark, put))
    _set_shard_handlers(hooked_handlers)
    x, y = batches[0]
    work = hook_work(lambda: jitted_after(params, x, y, LR) if raw
                     else jitted_after(params, jax.device_put(x), jax.device_put(y)))
    executions = metrics.counter_value("ExecuteComputation")
    metrics.uninstall()
    return {"got": got, "work": work, "executions": executions, "steps": steps,
            "load": (load_before, os.getloadavg()[0])}


UNHOOKED = ("without", "again", "bare")
ROWS = [("without, again / without (A/A: what no difference reads here)", "again", "without"),
        ("bare wrapper / without", "bare", "without"),
        ("loop unchanged, all hooks / without", "unchanged", "without"),
        ("loop unchanged, all hooks / bare wrapper", "unchanged", "bare"),
        ("jitted before install / without", "before", "without"),
        ("tracked + mark_step / without", "tracked", "without")]


def measure(size: str, smoke: bool, rounds: int = 200, processes: int = 1) -> None:
    """Runs ``collect`` in ``processes`` fresh processes one after another
    (``rounds`` shared among them; 1: in this one) and prints the ratios
    pooled over all their rounds, with each process's median: a process's
    memory layout biases its figures by up to ~1 % here (the medians of runs
    minutes apart differ by more than one run's interval), and fresh
    processes average that bias out instead of reporting one draw of it."""
    rounds = 4 if smoke else rounds
    parts = in_processes(__file__, size, rounds, 1 if smoke else processes,
                         lambda n: collect(size, n), timeout=1800)
    report(size, parts)


def report(size: str, parts: list[dict[str, Any]]) -> None:
    """Pooled ratios of the processes' rounds, per-process medians, verdicts."""
    wall, rounds, loads = pooled_rates(parts)
    print(f"[{size}] steps/s: without {wall['without']:.0f} "
          f"({1e6 / wall['without']:.0f} us/step), bare wrapper {wall['bare']:.0f}, loop "
          f"unchanged (all hooks) {wall['unchanged']:.0f}, jitted before install "
          f"{wall['before']:.0f}, tracked + mark_step {wall['tracked']:.0f} "
          f"({parts[0]['steps']} steps x {rounds} rounds in {len(parts)} process(es); load "
          f"average {loads}; {parts[0]['executions']} executions counted in the first)")
    print(f"[{size}] the hooks' work per step, loop unchanged (counted, not timed; the usual "
          f"step: on one in 16 each hook also reads the clock twice): {parts[0]['work']}")
    result = ratio_rows(parts, ROWS, f"[{size}]", ("CPU-second", "training-thread CPU-second"))
    if size == "tiny":  # ~0.13 ms a step: any Python in the loop shows; judged against the floor
        r = result[("unchanged", "bare")]
        verdict(f"overhead_jax {size} loop unchanged / bare-wrapper floor", r, ">= 0.99",
                r >= 0.99)
        return
    r = result[("unchanged", "without")]
    verdict(f"overhead_jax {size} loop unchanged, all hooks (with/without)", r, ">= 0.99",
            r >= 0.99)
    r = result[("tracked", "without")]
    verdict(f"overhead_jax {size} tracked + mark_step (with/without)", r, ">= 0.99", r >= 0.99)


def hook_work(step) -> str:  # type: ignore[no-untyped-def]
    """What the hooks run in one call of ``step`` (warm), counted: Python
    frames and opcodes in metrics/, and the C functions they call (load
    does not change these, unlike the timings)."""
    root = os.path.dirname(metrics.__file__) + os.sep
    opcodes: dict[str, int] = {}
    frames: dict[str, int] = {}
    c_calls: dict[str, int] = {}

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "opcode":
            opcodes[frame.f_code.co_name] = opcodes.get(frame.f_code.co_name, 0) + 1
        return local

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        if not frame.f_code.co_filename.startswith(root):
            return None
        frames[frame.f_code.co_name] = frames.get(frame.f_code.co_name, 0) + 1
        frame.f_trace_opcodes = True
        return local

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "c_call" and frame.f_code.co_filename.startswith(root):
            c_calls[arg.__name__] = c_calls.get(arg.__name__, 0) + 1

    step()
    metrics.recorder().flush()  # no fold inside the counted calls
    sys.settrace(tracer)
    try:
        step()
    finally:
        sys.settrace(None)
    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    per = ", ".join(f"{k} x{frames[k]} {opcodes.get(k, 0)}" for k in sorted(frames))
    calls = ", ".join(f"{k} x{n}" for k, n in sorted(c_calls.items()))
    return (f"{sum(frames.values())} Python frames, {sum(opcodes.values())} opcodes ({per}), "
            f"{sum(c_calls.values())} C calls ({calls})")


def _shard_handlers() -> tuple[dict[object, object], dict[object, object]]:
    """(the hook's numpy shard handlers, jax's own they wrap), by type."""
    try:
        from jax._src.interpreters import pxla
    except ImportError:
        return {}, {}
    hooked = {k: h for k, h in pxla.shard_arg_handlers.items() if hasattr(h, "__wrapped__")}
    return hooked, {k: h.__wrapped__ for k, h in hooked.items()}  # type: ignore[attr-defined]


def _bare(handler):  # type: ignore[no-untyped-def]
    """A bare pass-through wrapper of a shard handler: the floor in its place."""
    def bare_handler(xs, *args):  # type: ignore[no-untyped-def]
        return handler(xs, *args)

    return bare_handler


def _set_shard_handlers(handlers: dict[object, object]) -> None:
    if handlers:
        from jax._src.interpreters import pxla

        pxla.shard_arg_handlers.update(handlers)


if __name__ == "__main__":
    raise SystemExit(main())
