"""The one list of engines: their names, what triggers each, where its adapter is.

Adding an engine means one :class:`EngineSpec` in :data:`ENGINES` (and its
adapter module): ``metrics.install()`` (auto-detection and the post-import
hook), the ``tpu-info run`` bootstrap (which modules to wait for) and the
profiler's device traces (which profiler covers it) all read this table.

This module imports only the standard library, and nothing of ``metrics``:
the ``tpu-info run`` bootstrap loads it by file before the program runs,
as it loads :mod:`metrics.engines.importwatch`.

Example:
    >>> [e.name for e in ENGINES]
    ['jax', 'torch_compile', 'torch_lazy', 'torch_xla']
    >>> spec("torch_lazy").superseded_by
    ('torch_xla',)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineSpec", "ENGINES", "spec", "names", "triggers"]


@dataclass(frozen=True)
class EngineSpec:
    """One engine the hook knows.

    Attributes:
        name: what ``metrics.install(engines=[...])`` and the discovery
            record call it.
        trigger: the module whose import (finished) means the program uses
            the engine; ``install("auto")`` hooks the engine then.
        adapter: the module (or package) of its adapter, with a ``create(recorder,
            explain_cache_misses=...)`` that returns a
            :class:`metrics.engines.base.Engine`.
        superseded_by: engines that, when present too, make this one
            redundant (``torch_xla`` reads the counters ``torch_lazy`` reads).
    The engine's device profiler is its adapter's (``device_trace()``,
    :mod:`metrics.engines.device_profilers`), not an entry here.
    """

    name: str
    trigger: str
    adapter: str
    superseded_by: tuple[str, ...] = ()


# In load order: install() hooks engines found together in this order.
# Auto-detection for PyTorch: ``torch`` imported -> ``torch_compile`` (its
# hooks cost nothing until torch.compile runs); ``torch._lazy.ts_backend``
# imported (the program called ``torch._lazy.ts_backend.init()``) ->
# ``torch_lazy``; ``torch_xla`` imported -> ``torch_xla``, which then
# replaces ``torch_lazy``: both read the same lazy-tensor counters.
ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("jax", trigger="jax", adapter="metrics.engines.jax"),
    EngineSpec("torch_compile", trigger="torch", adapter="metrics.engines.torch.compile"),
    EngineSpec("torch_lazy", trigger="torch._lazy.ts_backend",
               adapter="metrics.engines.torch.lazy", superseded_by=("torch_xla",)),
    EngineSpec("torch_xla", trigger="torch_xla", adapter="metrics.engines.torch.xla"),
)

# The helpers below read ENGINES at each call (a few entries, read at install
# time and at imports, never on the hot path), so the table is the only state.


def spec(name: str) -> EngineSpec:
    """The engine called ``name``; KeyError when there is none."""
    for e in ENGINES:
        if e.name == name:
            return e
    raise KeyError(name)


def names() -> list[str]:
    """Every engine's name, sorted."""
    return sorted(e.name for e in ENGINES)


def triggers() -> frozenset[str]:
    """The modules whose import means the program uses one of the engines."""
    return frozenset(e.trigger for e in ENGINES)

