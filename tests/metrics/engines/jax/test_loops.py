"""A graph filled by one line of the user's (a Python loop unrolled into the
traced function) records that line and how many operations it put in
(metrics.engines.jax.loops), for a slow compile's advice."""

from __future__ import annotations


def test_a_graph_filled_by_a_python_loop_says_its_line(fresh_metrics):
    """100 slices and transposes traced at one line (mnist_vae's image_grid):
    the graph records that line and its operations; a plain graph none."""
    import jax
    import jax.numpy as jnp

    import metrics
    from tests.lines import line_of

    @jax.jit
    def grid(x):  # type: ignore[no-untyped-def]
        out = []
        for i in range(100):
            out.append(x[i].T * 2)  # THE LOOP
        return jnp.stack(out)

    @jax.jit
    def plain(x):  # type: ignore[no-untyped-def]
        return jnp.tanh(x @ x).sum()

    grid(jnp.ones((100, 4, 4))).block_until_ready()
    plain(jnp.ones((4, 4))).block_until_ready()
    graphs = {g.name: g for g in metrics.snapshot().graphs}
    g = graphs["jit(grid)"]
    assert g.loop_line == f"{__file__}:{line_of(__file__, '# THE LOOP')}"
    assert g.loop_ops == 400  # a slice, a squeeze, a transpose and a multiply each time
    assert graphs["jit(plain)"].loop_line == "" and graphs["jit(plain)"].loop_ops == 0
