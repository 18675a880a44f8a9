"""Cost of counting eager (un-jitted) JAX primitives per user line (CPU), side by side.

    python bench/eager_ops.py [--smoke]

Three contenders in alternating rounds, one process: JAX as it is, a bare
pass-through Python wrapper of ``EvalTrace.process_primitive`` (the floor any
Python hook there pays), and the hook (:mod:`metrics.engines.jax.eager`).
Prints ns per call of each and the ratios hooked / unhooked and hooked /
bare wrapper, for an eager ``jnp.reshape`` of a batch, an eager
``random.split`` (three primitives; the key's wrap and unwrap pass straight
through, the split is counted), and a jitted MLP step with no eager op
(its time only moves if the hook touched the jitted path).
Targets: hooked <= 1.3x unhooked per eager op; the jitted step 1.0x (<= 1.05).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _common import parser, three_way_report, three_ways  # noqa: E402

import metrics  # noqa: E402


def contenders() -> tuple[object, object, object]:
    """(unhooked, bare wrapper, hooked) ``EvalTrace.process_primitive``."""
    from jax._src.core import EvalTrace

    hooked = EvalTrace.__dict__["process_primitive"]
    plain = hooked.__wrapped__

    def bare(self, primitive, args, params, /):  # type: ignore[no-untyped-def]
        return plain(self, primitive, args, params)

    return plain, bare, hooked


def use(places: tuple[object, object, object], which: int) -> None:
    from jax._src.core import EvalTrace

    EvalTrace.process_primitive = places[which]  # type: ignore[method-assign]


def main() -> int:
    args = parser(__doc__).parse_args()
    rounds, n = (3, 500) if args.smoke else (15, 8_000)
    metrics.install(engines=["jax"], serve=False)
    places = contenders()
    batch = jnp.ones((32, 64))
    key = jax.random.PRNGKey(0)
    w = jnp.ones((64, 64))

    @jax.jit
    def step(w, b):  # type: ignore[no-untyped-def]
        return w - 0.01 * (jnp.tanh(b @ w).T @ b) / b.shape[0]

    def jitted() -> None:
        nonlocal w
        w = step(w, batch)

    cases = {"jnp.reshape (1 op)": (lambda: jnp.reshape(batch, (64, 32)), n),
             "random.split (1 of 3 ops counted)": (lambda: jax.random.split(key), n // 3),
             "jitted step (no eager op)": (jitted, n)}
    per = three_ways(cases, rounds, lambda which: use(places, which))
    jax.block_until_ready(w)
    three_way_report("eager_ops", per, against_bare=False,
                     target=lambda name: 1.05 if name.startswith("jitted") else 1.3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
