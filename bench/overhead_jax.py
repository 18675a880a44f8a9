"""Overhead of the hook on a small JAX MLP training loop (CPU).

    python bench/overhead_jax.py [--smoke]

Alternates short runs without and with the hook in one process (240 pairs of
100-step blocks, 24,000 steps each way, every step well under a millisecond)
and prints the median over pairs of steps/s with / without, for two MLPs:
"tiny" (~0.1 ms per step) and "mnist" (784-128-10, batch 32, ~0.25 ms).
"With" is the fully instrumented loop: hooks installed, jax.device_put of
each batch counted, the step wrapped in metrics.track, metrics.mark_step()
every step. Target >= 0.99. Also printed, in the same rounds: the loop left
as it was with the hooks installed (what `tpu-info run` gives: transfers
counted, no track or mark_step), the same with the step jitted after
install (every call counted by the jax.jit wrapper), and a 95 % bootstrap
interval of each median, so a reader can tell a miss from this machine's
noise.

Per call (a trivial jitted function, where the hook's share is largest): the
same jitted function called plainly, through a bare pass-through Python
wrapper, and through the hook's jax.jit wrapper; target: hooked <= 1.5x the
bare wrapper.
"""

from __future__ import annotations

import os
import random
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import median, parser, verdict  # noqa: E402

import metrics  # noqa: E402

# (batch, inputs, hidden, outputs): "tiny" is ~0.1 ms per step on this CPU,
# where any Python in the loop shows (even an empty call measures ~1 % here);
# "mnist" is the tutorial MNIST MLP (784-128-10, batch 32), ~0.25 ms per step.
SIZES = {"tiny": (64, 32, 256, 1), "mnist": (32, 784, 128, 10)}


def make_step():  # type: ignore[no-untyped-def]
    def loss_fn(params, x, y):  # type: ignore[no-untyped-def]
        (w1, b1), (w2, b2) = params
        h = jnp.tanh(x @ w1 + b1)
        return jnp.mean((h @ w2 + b2 - y) ** 2)

    @jax.jit
    def step(params, x, y):  # type: ignore[no-untyped-def]
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        new = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
        return new, loss

    return step


def run(step, params, batches, hooked: bool, put=None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(steps per wall second, steps per CPU second of this process)."""
    put = put or jax.device_put
    start, cpu = time.perf_counter(), time.process_time()
    for x, y in batches:
        params, loss = step(params, put(x), put(y))
        if hooked:
            metrics.mark_step()
    jax.block_until_ready(loss)
    n = len(batches)
    return n / (time.perf_counter() - start), n / max(time.process_time() - cpu, 1e-9)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--size", choices=[*SIZES, "all"], default="all")
    args = ap.parse_args()
    for size in SIZES if args.size == "all" else [args.size]:
        measure(size, args.smoke)
    per_call(args.smoke)
    return 0


def per_call(smoke: bool) -> None:
    """One jitted function, three ways, in alternating blocks (us per call)."""
    metrics.install(engines=["jax"], serve=False)
    hooked = jax.jit(lambda x: x + 1)  # jitted after install: the hook's wrapper
    plain = getattr(hooked, "_tpu_info_jitted", hooked)  # the same jitted function, unhooked

    def bare(*args, **kwargs):  # type: ignore[no-untyped-def]
        return plain(*args, **kwargs)

    x = jnp.ones(4)
    hooked(x).block_until_ready()
    calls, rounds = 2000, 3 if smoke else 40
    rng = random.Random(5)
    times: dict[str, list[float]] = {"plain": [], "bare": [], "hooked": []}
    over_bare, over_plain = [], []
    for _ in range(rounds):
        got = {}
        order = [("plain", plain), ("bare", bare), ("hooked", hooked)]
        rng.shuffle(order)
        for label, fn in order:
            start = time.perf_counter()
            for _ in range(calls):
                fn(x)
            got[label] = (time.perf_counter() - start) / calls * 1e6
            times[label].append(got[label])
        over_bare.append(got["hooked"] / got["bare"])
        over_plain.append(got["hooked"] / got["plain"])
    metrics.uninstall()
    load = os.getloadavg()[0]
    print(f"[per call] us per call: plain {median(times['plain']):.2f}, bare wrapper "
          f"{median(times['bare']):.2f}, hooked {median(times['hooked']):.2f} "
          f"({calls} calls x {rounds} rounds, load average {load:.2f})")
    print(f"[per call] hooked / plain {median(over_plain):.3f}; bare / plain "
          f"{median(times['bare']) / median(times['plain']):.3f}")
    r = median(over_bare)
    verdict("overhead_jax per hooked call / bare wrapper", r, "<= 1.5", r <= 1.5)


def measure(size: str, smoke: bool) -> None:
    batch, n_in, hidden, n_out = SIZES[size]
    # Many short alternating blocks: this VM's speed drifts by 2x within
    # seconds, so long runs compare different machines.
    steps = 100
    rounds = 4 if smoke else 240
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((batch, n_in), dtype=np.float32),
                rng.standard_normal((batch, n_out), dtype=np.float32)) for _ in range(steps)]
    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    params = ((jax.random.normal(k1, (n_in, hidden)) * 0.1, jnp.zeros(hidden)),
              (jax.random.normal(k2, (hidden, n_out)) * 0.1, jnp.zeros(n_out)))
    plain = make_step()
    run(plain, params, batches[:20], hooked=False)  # compile outside the timing
    metrics.install(engines=["jax"])
    tracked = metrics.track(plain)
    run(tracked, params, batches[:20], hooked=True)
    jitted_after = make_step()  # what a program gets with install() at its top
    run(jitted_after, params, batches[:20], hooked=False)
    metrics.uninstall()

    # The program installs once: hooks stay in, and "without" runs call the
    # original jitted function and jax.device_put and skip mark_step, so
    # they touch no hook. (Installing and removing the hooks around every
    # block would add a first-call cost that no real program pays.)
    original_put = jax.device_put
    metrics.install(engines=["jax"], serve=False)
    rng = random.Random(7)  # one generator: a random order per pair, the same every run
    order = [rng.random() < 0.5 for _ in range(rounds)]
    ratios, cpu_ratios, installed_ratios, without, with_ = [], [], [], [], []
    after_ratios = []
    for i in range(rounds):
        # Alternate which run goes first so drift on a shared machine cancels;
        # the installed-only run goes between them.
        runs = [("without", plain, False, original_put), ("installed", plain, False, None),
                ("after", jitted_after, False, None), ("with", tracked, True, None)]
        got = {}
        for label, fn, hooked, put in (runs if order[i] else runs[::-1]):
            got[label] = run(fn, params, batches, hooked, put)
        with_.append(got["with"])
        without.append(got["without"])
        ratios.append(got["with"][0] / got["without"][0])
        cpu_ratios.append(got["with"][1] / got["without"][1])
        installed_ratios.append(got["installed"][0] / got["without"][0])
        after_ratios.append(got["after"][0] / got["without"][0])
    metrics.uninstall()
    without = [w for w, _ in without]
    with_ = [w for w, _ in with_]
    print(f"[{size}] steps/s without hook {median(without):.0f}, with hook "
          f"{median(with_):.0f} ({steps} steps x {rounds} rounds, "
          f"{1e6 / median(without):.0f} us/step)")
    print(f"[{size}] steps per CPU-second ratio (with/without): {median(cpu_ratios):.3f}")
    if len(ratios) > 1:
        q = statistics.quantiles(ratios, n=4)
        print(f"[{size}] per-pair ratio quartiles {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f}; "
              f"median {median(ratios):.3f}, 95 % interval {_interval(ratios)}")
        print(f"[{size}] hooks installed, loop unchanged (transfers counted): "
              f"{median(installed_ratios):.3f}, 95 % interval {_interval(installed_ratios)}")
        print(f"[{size}] ... and the step jitted after install (its calls counted): "
              f"{median(after_ratios):.3f}, 95 % interval {_interval(after_ratios)}")
    r = median(ratios)
    verdict(f"overhead_jax {size} steps/s ratio (with/without)", r, ">= 0.99", r >= 0.99)


def _interval(xs: list[float], resamples: int = 2000) -> str:
    """A 95 % bootstrap interval of the median of ``xs``."""
    rng = random.Random(11)
    meds = sorted(median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    return f"{meds[int(0.025 * resamples)]:.3f}-{meds[int(0.975 * resamples)]:.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
