"""Which rank of its job this process is, as a snapshot carries it.

A host exporter labels every series with ``process_index`` so a fleet query
can name the rank that differs. Each engine says it its own way (its probe
lives with the engine: :mod:`metrics.engines.ranks`) through
:meth:`~metrics.recording.sources.Source.rank`; ``$RANK`` / ``$WORLD_SIZE``
(set by torchrun and most launchers) is the fallback when no engine knows.
This module is below the engines: the snapshot reads it, engines fill it.

Example:
    >>> from_environment({"RANK": "3", "WORLD_SIZE": "8"})
    Rank(index=3, count=8, source='env')
    >>> from_environment({}) is None
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Rank", "from_environment"]


@dataclass(frozen=True, slots=True)
class Rank:
    """A process's rank among ``count`` processes (None: not said), and who said it."""

    index: int
    count: int | None
    source: str


def _int(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    return int(text)


def from_environment(environ: Mapping[str, str] | None = None) -> Rank | None:
    """``$RANK`` (else ``$LOCAL_RANK`` only when it is the whole world:
    ``$WORLD_SIZE`` == ``$LOCAL_WORLD_SIZE``) with ``$WORLD_SIZE``."""
    env = os.environ if environ is None else environ
    count = _int(env.get("WORLD_SIZE"))
    index = _int(env.get("RANK"))
    if index is None and count is not None and count == _int(env.get("LOCAL_WORLD_SIZE")):
        index = _int(env.get("LOCAL_RANK"))
    if index is None:
        return None
    return Rank(index, count if count is not None and count > index else None, "env")
