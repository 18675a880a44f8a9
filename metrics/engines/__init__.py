"""Engine adapters: one module per engine, loaded only when needed.

``import metrics`` never imports an engine: :func:`load` imports the adapter
(and thereby the engine) only when ``metrics.install()`` finds the engine
already imported by the program or is asked for it by name.

* :mod:`metrics.engines.registry`: the one table of engines (name, the
  module whose import triggers it, its adapter module, load order), read by
  ``install()``, the ``tpu-info run`` bootstrap and the profiler.
* :mod:`metrics.engines.base`: :class:`Engine`, the typed protocol every
  adapter meets, and :class:`EngineBase`, the defaults of the optional
  readings.

Adding an engine: an adapter (a module, or a package whose ``__init__``
offers them: :mod:`metrics.engines.torch`, :mod:`metrics.engines.jax`) with a
subclass of :class:`EngineBase` and a ``create(recorder,
explain_cache_misses=...)``, and one entry in
:data:`metrics.engines.registry.ENGINES`.
"""

from __future__ import annotations

import importlib
from typing import Protocol

# importwatch: bound here too, as `tpu-info run`'s bootstrap may have loaded it by file
from metrics.engines import importwatch, registry
from metrics.engines.base import Engine, EngineBase, Readings
from metrics.engines.registry import EngineSpec, spec
from metrics.recording.recorder import Recorder

__all__ = ["Engine", "EngineBase", "EngineSpec", "Readings", "Adapter", "specs",
           "valid_names", "detect", "superseded", "load", "create", "spec"]


class Adapter(Protocol):
    """An adapter module: what :func:`create` calls."""

    def create(self, recorder: Recorder, explain_cache_misses: bool = True) -> Engine: ...


def specs() -> tuple[EngineSpec, ...]:
    """Every engine, in load order (:data:`metrics.engines.registry.ENGINES`)."""
    return registry.ENGINES


def valid_names() -> list[str]:
    """Every engine name ``metrics.install(engines=[...])`` accepts, sorted."""
    return registry.names()


def _imported(module: str) -> bool:
    """``module`` is imported and its body finished: one still importing (torch
    finishing inside ``import torch_xla``) is waited for, never half-loaded.
    A module whose post-import callback is running (its body ran, importlib
    still marks it initializing) counts as imported."""
    return importwatch.ready(module)


def superseded(name: str, present: set[str] | list[str]) -> bool:
    """Whether an engine in ``present`` makes ``name`` redundant."""
    return any(s in present for s in spec(name).superseded_by)


def detect() -> list[str]:
    """Engines whose library the program has already imported, in load order."""
    found = [e.name for e in specs() if _imported(e.trigger)]
    return [n for n in found if not superseded(n, found)]


def load(name: str) -> Adapter:
    """The adapter module for ``name``; imports the engine itself."""
    module: Adapter = importlib.import_module(spec(name).adapter)  # type: ignore[assignment]
    return module


def create(name: str, recorder: Recorder, explain_cache_misses: bool = True) -> Engine:
    """Loads ``name``'s adapter and creates its engine (not installed yet)."""
    return load(name).create(recorder, explain_cache_misses=explain_cache_misses)
