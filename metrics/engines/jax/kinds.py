"""The record kinds of the JAX transfer hook's journal, in one numpy-free
module: the modules the hot path imports (``calls`` -> ``gaps``) read them
here, so ``metrics.track()`` of a plain function needs no numpy.

The numbers are the journal's first field (``implicit.FIELDS`` values a
record); ``sites``, ``implicit``, ``drains`` and ``gaps`` name them from here.
"""

from __future__ import annotations

# A device->host read and an implicit host->device copy: the kinds a site is
# kept under (an untimed host->device record is kept as IMPLICIT_H2D).
SYNC, IMPLICIT_H2D = 0, 1
# A jax.device_get's leaf (a wait too), an explicit jax.device_put of host data,
# and an implicit copy not timed (the jit wrapper's: start == end).
EXPLICIT_D2H, EXPLICIT_H2D, UNTIMED_H2D = 2, 3, 4
EAGER_OP = 5  # eager primitives (metrics.engines.jax.eager): apart from the record kinds
# The loop's gaps (gaps.py): a call of a jitted function that is not the step
# (its first after other work), a jax.device_get, the step's call after a gap.
CALL, GET, GAP_END = 6, 7, 8
