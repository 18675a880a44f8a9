"""Cost of counting eager (un-jitted) JAX primitives per user line (CPU), side by side.

    python bench/eager_ops.py [--smoke]

Three contenders in alternating rounds, one process: JAX as it is, a bare
pass-through Python wrapper of ``EvalTrace.process_primitive`` and of the
indexing functions (the floor any Python hook there pays), and the hook
(:mod:`metrics.engines.jax.eager`, :mod:`metrics.engines.jax.indexing`).
Prints ns per call of each and the ratios hooked / unhooked and hooked /
bare wrapper, for an eager ``jnp.reshape`` of a batch, a batch gathered
with a numpy index (equinox's loader: one timed call around its five
primitives), an eager
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
import numpy as np  # noqa: E402
from _common import parser, three_way_report, three_ways  # noqa: E402

import metrics  # noqa: E402


def contenders() -> list[tuple[object, str, tuple[object, object, object]]]:
    """(owner, attribute, (unhooked, bare wrapper, hooked)) for
    ``EvalTrace.process_primitive`` and the indexing functions."""
    from jax._src.core import EvalTrace
    from jax._src.numpy import indexing
    from jax._src.ops import scatter

    out = []
    for owner, attr in ((EvalTrace, "process_primitive"), (indexing, "rewriting_take"),
                        (scatter, "_scatter_update")):
        hooked = vars(owner)[attr]
        plain = hooked.__wrapped__

        def bare(*args, _plain=plain, **kwargs):  # type: ignore[no-untyped-def]
            return _plain(*args, **kwargs)

        out.append((owner, attr, (plain, bare, hooked)))
    return out


def use(places: list[tuple[object, str, tuple[object, object, object]]], which: int) -> None:
    for owner, attr, three in places:
        setattr(owner, attr, three[which])


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

    data, perm = jnp.ones((4096, 16, 2)), np.random.default_rng(0).permutation(4096)
    cases = {"jnp.reshape (1 op)": (lambda: jnp.reshape(batch, (64, 32)), n),
             "x[numpy index] (one timed call)": (lambda: data[perm[:32]], n // 10),
             "random.split (1 of 3 ops counted)": (lambda: jax.random.split(key), n // 3),
             "jitted step (no eager op)": (jitted, n)}
    per = three_ways(cases, rounds, lambda which: use(places, which))
    jax.block_until_ready(w)
    three_way_report("eager_ops", per, against_bare=False,
                     target=lambda name: 1.05 if name.startswith("jitted") else 1.3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
