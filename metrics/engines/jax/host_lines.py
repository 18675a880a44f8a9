"""JAX's host work between steps: :class:`metrics.engines.host_lines.HostLines`
with numpy's conversions of a jax.Array at a user line told apart as reads
(:mod:`metrics.engines.jax.numpy_reads`), said as sampled ``sync`` sites
(:meth:`HostLines.read_sites`).

The intervals begin after the step's timed call (:mod:`.calls`, a library
wrapper's: :mod:`.wrappers`) and end at any counted ``jax.jit`` call; time
under JAX's, jaxlib's and this hook's code is the engine's, and JAX's is
also charged to the user's line that entered it
(:mod:`metrics.engines.jax.eager_lines`: ``eager_work`` readings).

Example:
    >>> lines = HostLines(frames_for(skip_prefixes()), ())   # doctest: +SKIP
    >>> lines.after_step(time.monotonic_ns(), step_calls)    # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import CodeType

from metrics.engines import host_lines as _generic
from metrics.engines._frames import LibraryFrames
from metrics.engines.host_sites import median_ns, work_sites
from metrics.engines.jax.eager_lines import EagerLines
from metrics.engines.jax.numpy_reads import Resolver, readers
from tpu_info.contract.model import Phase, SiteKind, SiteReading

__all__ = ["HostLines"]


class HostLines(_generic.HostLines):
    """The generic intervals, numpy's reads of a jax.Array kept apart."""

    def __init__(self, frames: LibraryFrames, engine_dirs: tuple[str, ...],
                 call_code: CodeType | None = None, clock: Callable[[], int] | None = None,
                 on_error: Callable[[str, BaseException], None] | None = None,
                 own_codes: tuple[CodeType, ...] = ()) -> None:
        """``own_codes``: the jit wrapper's (its time and what it calls, the hook's)."""
        super().__init__(frames, engine_dirs, call_code, clock=clock or time.monotonic_ns,
                         on_error=on_error, readers=readers(), resolver=Resolver())
        self.eager = EagerLines(self._kind, own_codes)

    def forget(self) -> None:
        super().forget()
        self.eager.forget()

    def sites(self, mono_to_unix: float, steps: int = 0) -> list[SiteReading]:
        """One ``host_work`` reading per line with time in the sampled intervals,
        one ``eager_work`` per line with JAX's time there, and one ``sync``
        reading per line that read a jax.Array through numpy
        (:meth:`read_sites`); ``steps``: the step function's calls so far."""
        return (work_sites(self, mono_to_unix) + self.eager.sites(mono_to_unix)
                + self.read_sites(mono_to_unix, steps))

    def read_sites(self, mono_to_unix: float, steps: int) -> list[SiteReading]:
        """A ``sync`` reading per line whose numpy conversion read a jax.Array
        in at least half the latest sampled intervals (each one step's gap):
        sampled, so ``timed`` is the reads timed and ``seconds`` their waits
        (all of them: a wait's long tail is what it costs), ``count`` and
        ``bytes`` the steps' worth (the reads per interval times ``steps``)."""
        from metrics.engines.jax.sites import where

        n, out = self.intervals, []
        rows = [(r.code, r.line, r.what, median_ns(list(r.recent), n), r.reads, r.bytes,
                 r.intervals, r.ns) for r in list(self.reads.values())] if n and steps else []
        for code, line, what, median, reads, nbytes, intervals, ns in rows:
            if median > 0 and reads:  # (a wait's tail is its cost: all of them, no median)
                path, function = where(code, -1)
                count = max(reads, round(steps * reads / n))
                out.append(SiteReading(
                    kind=SiteKind.SYNC.value, location=f"{path.rsplit(':', 1)[0]}:{line}",
                    count=count, bytes=round(nbytes * count / reads), seconds=ns / 1e9,
                    function=function, detail=what, first_seen_unix=self.first / 1e9
                    + mono_to_unix, last_seen_unix=self.last / 1e9 + mono_to_unix,
                    phase=Phase.STEP.value, occurrences=max(intervals, round(
                        steps * intervals / n)), timed=reads, timed_bytes=nbytes))
        return out

