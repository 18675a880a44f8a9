"""Ground truth on the chip for numpy batches fed to a jitted step, no hook:
where their cost goes (host time inside the call, or the device), for a flax
``nnx.jit`` step and a plain ``jax.jit`` one (issue 41's numpy and flax rows).

    JAX_PLATFORMS=tpu XLA_FLAGS= python3 bench/tpu_numpy_truth.py [--size 1024] [--steps 300]

flax and optax come from the machine's own index (``reference/tpu-machine.md``).
For each step kind, numpy batches against device-resident ones, async and
with a block each step: the step's period and the median host time of the
call; then a ``device_put``'s host time and how long until its array is
ready on an idle device, and one step alone on resident inputs. On a TPU v5e
(2026-12-06, size 1024, 1 MB a batch): flax async 1117 us a step on device
batches (host call 1082 us: host-bound), 1425 on numpy (host call 1419: the
batches cost 337 us of host time inside the call); plain jit 194 against 324
(host call 183 against 312: 130 us); a 1 MB put returns in 260 us and is
ready after 773 us; one flax step alone 1665 us, one jit step 779 us.
"""

from __future__ import annotations

import statistics as st
import sys
import time

import numpy as np
from _common import parser


def main() -> int:  # noqa: C901, PLR0915 - one experiment, top to bottom
    p = parser(__doc__)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    size, N = (128, 10) if a.smoke else (a.size, a.steps)
    import jax
    import jax.numpy as jnp
    try:
        import optax
        from flax import nnx
    except ImportError:
        print("tpu_numpy_truth: flax and optax are needed (reference/tpu-machine.md)")
        return 0
    jnp.zeros(()).block_until_ready()
    rng = np.random.default_rng(0)
    data = rng.standard_normal((64, 256, size), np.float32)
    on_device = jax.device_put(data)
    on_device.block_until_ready()
    batches = [on_device[k] for k in range(64)]
    jax.block_until_ready(batches)

    class MLP(nnx.Module):
        def __init__(self, n, rngs):  # type: ignore[no-untyped-def]
            self.l1, self.l2 = nnx.Linear(n, n, rngs=rngs), nnx.Linear(n, n, rngs=rngs)

        def __call__(self, x):  # type: ignore[no-untyped-def]
            return self.l2(jnp.tanh(self.l1(x)))

    model = MLP(size, nnx.Rngs(0))
    try:
        opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    except TypeError:  # flax before 0.11
        opt = nnx.Optimizer(model, optax.adam(1e-3))

    def loss_fn(model, x, y):  # type: ignore[no-untyped-def]
        return jnp.mean((model(x) - y) ** 2)

    @nnx.jit
    def train_step(model, opt, x, y):  # type: ignore[no-untyped-def]
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        try:
            opt.update(model, grads)
        except TypeError:  # flax before 0.11
            opt.update(grads)
        return loss

    @jax.jit
    def step(w, x, y):  # type: ignore[no-untyped-def]
        def lf(w):  # type: ignore[no-untyped-def]
            h = x
            for _ in range(3):
                h = jnp.tanh(h @ w)
            return jnp.mean((h - y) ** 2)
        loss, g = jax.value_and_grad(lf)(w)
        return w - 1e-3 * g, loss

    # The inner jax.jit call (where the hook's jit wrapper times numpy
    # arguments) timed apart from nnx.jit's own Python around it.
    inner: list[float] = []
    leaf_types: set[str] = set()
    jitted = train_step.jitted_fn

    def timed_inner(*args, **kwargs):  # type: ignore[no-untyped-def]
        leaf_types.update(type(x).__name__ for x in jax.tree.leaves((args, kwargs))
                          if not isinstance(x, jax.Array))
        h = time.perf_counter()
        out = jitted(*args, **kwargs)
        inner.append(time.perf_counter() - h)
        return out

    train_step.jitted_fn = timed_inner
    state = {"w": jnp.asarray(rng.standard_normal((size, size), np.float32) / size ** 0.5)}
    for src in (data, batches):
        train_step(model, opt, src[0], src[1]).block_until_ready()
        state["w"], loss = step(state["w"], src[0], src[1])
        loss.block_until_ready()

    def loop(kind: str, numpy: bool, sync: bool) -> tuple[float, float, float]:
        src, host = (data if numpy else batches), []
        del inner[:]
        t0 = time.perf_counter()
        for i in range(N):
            j = i % 63
            h = time.perf_counter()
            if kind == "flax":
                loss = train_step(model, opt, src[j], src[j + 1])
            else:
                state["w"], loss = step(state["w"], src[j], src[j + 1])
            host.append(time.perf_counter() - h)
            if sync:
                loss.block_until_ready()
        jax.block_until_ready(loss)
        return ((time.perf_counter() - t0) / N * 1e6, st.median(host) * 1e6,
                st.median(inner) * 1e6 if inner else 0.0)

    res: dict[tuple[str, bool, bool], list[tuple[float, float, float]]] = {}
    for _ in range(1 if a.smoke else 3):
        for kind in ("flax", "jit"):
            for sync in (False, True):
                for numpy in (True, False):
                    res.setdefault((kind, sync, numpy), []).append(loop(kind, numpy, sync))
    for (kind, sync, numpy), v in sorted(res.items()):
        print(f"tpu_numpy_truth {kind} {'sync' if sync else 'async'} "
              f"{'numpy ' if numpy else 'device'}: step {st.median(x[0] for x in v):.1f} us, "
              f"host call {st.median(x[1] for x in v):.1f} us"
              + (f" (inner jax.jit call {st.median(x[2] for x in v):.1f} us)"
                 if kind == "flax" else ""))
    print(f"tpu_numpy_truth non-array leaves into the inner jax.jit call: {sorted(leaf_types)}")
    for n in (1, 2):
        hs, cs = [], []
        for i in range(10 if a.smoke else 50):
            t0 = time.perf_counter()
            put = [jax.device_put(data[(i + k) % 64]) for k in range(n)]
            t1 = time.perf_counter()
            jax.block_until_ready(put)
            hs.append(t1 - t0)
            cs.append(time.perf_counter() - t0)
        print(f"tpu_numpy_truth device_put x{n} ({data[0].nbytes / 1e6:.1f} MB each): host "
              f"{st.median(hs) * 1e6:.0f} us, ready after {st.median(cs) * 1e6:.0f} us")
    for kind in ("flax", "jit"):
        ts = []
        for i in range(10 if a.smoke else 50):
            jax.block_until_ready((state["w"], batches))
            t0 = time.perf_counter()
            if kind == "flax":
                loss = train_step(model, opt, batches[i % 63], batches[i % 63 + 1])
            else:
                state["w"], loss = step(state["w"], batches[i % 63], batches[i % 63 + 1])
            loss.block_until_ready()
            ts.append(time.perf_counter() - t0)
        print(f"tpu_numpy_truth {kind} one step alone on resident inputs: "
              f"{st.median(ts) * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
