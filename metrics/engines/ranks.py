"""Each engine's probe of this process's rank in its job, read at scrape time.

:class:`~metrics.recording.ranks.Rank` and the launchers' ``$RANK`` fallback
live below the engines (:mod:`metrics.recording.ranks`: the snapshot reads
them); here is how each engine says it: ``jax.process_index()`` /
``jax.process_count()``, ``torch.distributed``'s rank and world size once a
process group exists, torch_xla's global ordinal and world size. Every probe
is a few attribute reads and calls, made only when a snapshot is built, and
never raises (a failing probe is "unknown").

Example:
    >>> from_jax() is None or from_jax().source == "jax"
    True
"""

from __future__ import annotations

import sys

from metrics.recording.ranks import Rank

__all__ = ["Rank", "from_jax", "from_torch_distributed", "from_torch_xla"]


def from_jax() -> Rank | None:
    """``jax.process_index()`` of an imported jax (0 of 1 without
    ``jax.distributed.initialize``: that is the truth for one process), once
    the program started JAX's backends. Never before: the probe would start
    them, and the program's own ``jax.distributed.initialize()`` then raises
    (it must come before any backend starts; on a TPU the backend takes the
    chips)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    started = getattr(sys.modules.get("jax._src.xla_bridge"), "backends_are_initialized", None)
    try:
        if started is None or not started():
            return _jax_job()
        return Rank(int(jax.process_index()), int(jax.process_count()), "jax")
    except Exception:  # noqa: BLE001 - no backend yet, or a plugin that refuses
        return None


def _jax_job() -> Rank | None:
    """The rank ``jax.distributed.initialize()`` gave, read before any
    backend started (its coordinator state; None outside a job)."""
    state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
    try:
        if state is None or getattr(state, "client", None) is None:
            return None
        return Rank(int(state.process_id), int(state.num_processes), "jax")
    except Exception:  # noqa: BLE001 - a JAX that keeps it elsewhere
        return None


def from_torch_distributed() -> Rank | None:
    """``torch.distributed``'s rank once the program made a process group."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return Rank(int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed")
    except Exception:  # noqa: BLE001
        return None


def from_torch_xla() -> Rank | None:
    """torch_xla's global ordinal (``torch_xla.runtime``), once the program
    started the XLA runtime. Never before: the probe would start it (a PJRT
    client that takes the devices), so a ``torch_xla.launch`` parent that
    runs no XLA would hold its workers' devices and spend its exit tearing
    the client down (0.2-0.4 s more than without the hook)."""
    runtime = sys.modules.get("torch_xla.runtime")
    xla = sys.modules.get("torch_xla")
    try:
        if runtime is None or xla is None:
            return None
        started = getattr(xla._XLAC, "_xla_runtime_is_initialized", None)
        if started is None or not started():
            return None
        return Rank(int(runtime.global_ordinal()), int(runtime.world_size()), "torch_xla")
    except Exception:  # noqa: BLE001 - no PJRT client yet
        return None
