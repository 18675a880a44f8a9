"""What the JAX hooks share: the engine that is installed, the count of
compiles and the thread-local state of a compile in progress.

The one seam between the engine (:mod:`metrics.engines.jax`, which sets
:data:`active` at install) and the wrappers that run in the user's calls
(:mod:`~metrics.engines.jax.calls`, :mod:`~metrics.engines.jax.aot`,
:mod:`~metrics.engines.jax.track`): they read these names and never the
engine module's, so nothing imports the engine back (no import cycle).

Example:
    >>> from metrics.engines.jax import state as jax_state
    >>> jax_state.active is None or jax_state.active.name == "jax"
    True
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

ENGINE = "jax"

# The installed JaxEngine (None while none is): each wrapper reads it once
# per call and passes straight through when it is None.
active: Any = None

# Bumped by every compile; a counted call compares it before and after,
# which is cheaper than resetting a thread-local on every call.
compile_seq = [0]

# Per thread: ``compile`` (the context of a compile in progress),
# ``lowering`` (the signature the next compile gets), ``causes`` (pending
# recompile explanations by function) and ``compiles`` ((seq, graph hash) of
# this thread's newest compiles: a counted call learns its graph).
local = threading.local()
RECENT_COMPILES = 64  # per thread; a call that compiles more finds its first among these


def note_compile(graph_hash: str) -> None:
    """Counts one compile (the engine calls it) and notes its graph for the
    call it happens in."""
    compile_seq[0] += 1
    recent = getattr(local, "compiles", None)
    if recent is None:
        recent = local.compiles = deque(maxlen=RECENT_COMPILES)
    recent.append((compile_seq[0], graph_hash))


def compiled_since(seq: int) -> str | None:
    """The graph of this thread's first compile after ``seq``: a call's own
    graph (compiles nested in running it, such as resharding an input of a
    pmapped call, come after it); None when this thread compiled none."""
    for n, graph_hash in getattr(local, "compiles", ()):
        if n > seq:
            return graph_hash
    return None

# Hot paths write each record as its fields, in one ``deque.extend`` (atomic
# under the GIL, like an append): the journal then holds only numbers and
# existing objects, so records waiting to be folded make no new objects for
# the garbage collector to count and trace, and a fold takes each field as
# one slice. Transfers: (to_device, start, end, bytes). Counted calls:
# (owner, key, start, end, compiled graph or None).
TRANSFER_FIELDS = 4
CALL_FIELDS = 5
