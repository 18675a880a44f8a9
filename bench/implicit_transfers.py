"""Cost of counting implicit transfers in JAX (CPU), side by side.

    python bench/implicit_transfers.py [--smoke]

Three contenders in alternating rounds, one process: JAX as it is, JAX with
a bare pass-through Python wrapper in the same place (the floor any Python
hook pays), and JAX with the hook (``ArrayImpl._value`` for
``float(x)``, the ``stage_p`` implementation for ``jnp.asarray(numpy)``).
Prints ns per call of each and the ratios hooked / unhooked and hooked /
bare wrapper, for ``float(x)`` of a ready scalar, ``jnp.asarray`` of a 4 KB
numpy batch, and a jitted MLP step followed by ``float(loss)``.
Target: hooked <= 1.5x the bare wrapper per call.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import parser, three_way_report, three_ways  # noqa: E402

import metrics  # noqa: E402


def contenders() -> dict[str, tuple[object, object, object]]:
    """(unhooked, bare wrapper, hooked) for each place the hook patches."""
    from jax._src.array import ArrayImpl
    from jax._src.core import stage_p

    hooked_value = ArrayImpl.__dict__["_value"]
    fget = hooked_value.fget.__wrapped__

    def bare_get(self):  # type: ignore[no-untyped-def]
        return fget(self)

    hooked_impl = stage_p.impl
    impl = hooked_impl.__wrapped__

    def bare_impl(*args, **params):  # type: ignore[no-untyped-def]
        return impl(*args, **params)

    return {"value": (property(fget), property(bare_get), hooked_value),
            "stage": (impl, bare_impl, hooked_impl)}


def use(places: dict[str, tuple[object, object, object]], which: int,
        only: str | None = None) -> None:
    """Puts contender ``which`` (0 unhooked, 1 bare wrapper, 2 hooked) in
    place, in every place or ``only`` one ("value", "stage")."""
    from jax._src.array import ArrayImpl
    from jax._src.core import stage_p

    if only in (None, "value"):
        ArrayImpl._value = places["value"][which]
    if only in (None, "stage"):
        stage_p.impl = places["stage"][which]


def main() -> int:
    args = parser(__doc__).parse_args()
    rounds, n = (3, 2_000) if args.smoke else (15, 20_000)
    metrics.install(engines=["jax"], serve=False)
    places = contenders()
    batch = np.ones((32, 32), np.float32)
    w, on_device = jnp.ones((32, 32)), jnp.ones((32, 32))

    @jax.jit
    def step(w, b):  # type: ignore[no-untyped-def]
        return w - 0.01 * (b @ w), jnp.mean(b @ w)

    def loop() -> None:
        nonlocal w
        w, loss = step(w, on_device)
        float(loss)

    scalar = jnp.float32(3.0) * 2
    cases = {"float(x)": (lambda: float(scalar), n),
             "jnp.asarray(4 KB numpy)": (lambda: jnp.asarray(batch), n // 4),
             "jit step + float(loss)": (loop, n // 8)}
    per = three_ways(cases, rounds, lambda which: use(places, which))
    three_way_report("implicit_transfers", per, against_bare=True, target=lambda _: 1.5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
