"""A torch program's DataLoader batches, timed where the training loop draws them.

pytorch/examples' vae decodes and transforms each sample in the training
process (``DataLoader(num_workers=0)``: PIL and ``transforms`` per sample in
``__getitem__``), 24-25 % of its loop by A/B, and nothing timed it: it was
the steps' own time. The hook wraps the DataLoader iterator's ``__next__``
(``torch.utils.data.dataloader._BaseDataLoaderIter``: the single-process
and the worker iterators both inherit it) and times every batch the main
thread draws: two clock reads and one journal append of ``(site, start,
end)`` (:class:`~metrics.recording.journal.Journal`, the recorder's: folded
before every read, cleared at a reset, a fold's error counted by the
recorder's guard). With ``num_workers=0`` a batch's time is its samples'
loading and collation; with workers, the main thread's wait for a batch
they had not made yet.

The site is the user's line that drew the batches (the ``for`` line: the
frame that called ``__next__``, through any library around the loader,
``tqdm``, as ``via``), found once per iterator (an epoch's), on its first
batch, and kept on the iterator; its ``detail`` says the loader's
``num_workers``. A loader iterated from another thread (a prefetching
thread of the program's) is not timed: only the main thread's waits are
the loop's; nor is one in a function Dynamo traces. The hook costs about
2 us a batch (a bare ``DataLoader(list, batch_size=None)``: 25 us a
batch unhooked, 27 hooked, at load 10).

Example:
    >>> from metrics.recording.recorder import Recorder
    >>> times = LoaderTimes(Recorder())
    >>> site = times.site("/w/train.py:40", "", 0)
    >>> times.queue.extend((site, 1_000_000, 3_000_000))
    >>> [(x.kind, x.location, x.count, x.seconds, x.detail) for x in times.sites(None)]
    [('data_loader', '/w/train.py:40', 1, 0.002, 'num_workers=0')]
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metrics.engines._frames import user_line
from metrics.recording.recorder import Recorder
from tpu_info.contract.diagnosis import SiteKind
from tpu_info.contract.model import SiteReading, StepsReading
from tpu_info.contract.phases import phase_of

if TYPE_CHECKING:
    from metrics.engines._patching import Patches
    from metrics.engines.torch.context import TorchContext

__all__ = ["LoaderTimes"]

FIELDS = 3  # a batch in the journal: (site, start, end in monotonic ns)
MAX_SITES = 64  # loader lines kept apart; later ones are not timed
ATTR = "_tpu_info_loader_site"  # the iterator's site, set on its first batch
_KIND = SiteKind.DATA_LOADER.value


def _cores() -> int:
    """The cores this process may run on (its workers and its step share
    them), 0 where not told."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 0


class _Site:
    """One line that drew DataLoader batches, and their time: ``tally`` is
    (batches, their ns in ``__next__``, the first's start, the latest's
    end), replaced whole by a fold (a reader takes it in one load)."""

    __slots__ = ("location", "via", "workers", "tally")

    def __init__(self, location: str, via: str, workers: int) -> None:
        self.location, self.via, self.workers = location, via, workers
        self.tally = (0, 0, 0, 0)


_UNKEPT = _Site("", "", 0)  # where a line past MAX_SITES goes (never read)


class LoaderTimes:
    """The main thread's DataLoader batches, per line (one per engine)."""

    def __init__(self, recorder: Recorder) -> None:
        self.to_unix = recorder.mono_to_unix  # monotonic seconds -> unix
        self.by_key: dict[tuple[str, int], _Site] = {}
        self.journal = recorder.journal(self._fold)
        self.queue = self.journal.queue
        recorder.on_reset(self.clear)

    # Hook (in the program: two clock reads and an append a batch) ----------

    def install(self, patches: Patches, ctx: TorchContext) -> None:
        """Wraps the DataLoader iterator's ``__next__`` (restored with ``patches``)."""
        try:
            import torch
            from torch.utils.data import dataloader
        except ImportError as e:
            ctx.degraded.append(f"torch.utils.data not importable ({e}): DataLoader not timed")
            return
        main = threading.main_thread().ident
        compiling = torch.compiler.is_compiling
        get_ident, clock = threading.get_ident, time.monotonic_ns
        journal, queue = self.journal, self.queue
        where = functools.partial(self._where, ctx)

        def wrap_next(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
            @functools.wraps(original)
            def __next__(self: Any) -> Any:
                # Another thread's loader is not the loop's wait; a loop Dynamo
                # traces would break its graph at the clock reads.
                if get_ident() != main or compiling():
                    return original(self)
                start = clock()
                out = original(self)  # StopIteration (the epoch's end) is not a batch
                end = clock()
                try:
                    site = self.__dict__.get(ATTR) or where(self)
                    queue.extend((site, start, end))
                    if len(queue) >= journal.fold_at:
                        journal.flush()
                except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                    ctx.failed("torch.loader", e)
                return out
            return __next__

        patches.apply(dataloader._BaseDataLoaderIter, "__next__", wrap_next)

    def _where(self, ctx: TorchContext, it: Any) -> _Site:
        """The site of iterator ``it``'s batches: the user's line that drew its
        first (called from ``__next__``'s wrapper), kept on ``it``."""
        here = user_line(ctx.skip, 3)  # _where <- __next__ <- the user's frame
        workers = int(getattr(it, "_num_workers", 0) or 0)
        site = (self.site(here.location, here.via, workers) if here is not None
                else _UNKEPT)
        setattr(it, ATTR, site)
        return site

    def site(self, location: str, via: str, workers: int) -> _Site:
        """The site kept for ``location`` and ``workers`` (made on first use)."""
        key = (location, workers)
        site = self.by_key.get(key)
        if site is None:
            if len(self.by_key) >= MAX_SITES:
                return _UNKEPT
            site = self.by_key[key] = _Site(location, via, workers)
        return site

    # Fold (before every read, or on the appending thread) -----------------

    def _fold(self, flat: list[Any]) -> None:
        tallies: dict[_Site, tuple[int, int, int, int]] = {}
        for site, start, end in zip(flat[0::FIELDS], flat[1::FIELDS], flat[2::FIELDS],
                                    strict=True):
            count, ns, first, _ = tallies.get(site) or site.tally
            tallies[site] = (count + 1, ns + end - start, first or start, end)
        for site, tally in tallies.items():
            site.tally = tally

    # Read ------------------------------------------------------------------

    def sites(self, steps: StepsReading | None) -> list[SiteReading]:
        """One ``data_loader`` reading per line that drew batches: ``count``
        batches, ``seconds`` the main thread's time in their ``__next__``."""
        self.journal.flush()
        out = []
        cores = _cores()
        for site in list(self.by_key.values()):
            count, ns, first_ns, last_ns = site.tally
            if not count:
                continue
            first, last = first_ns / 1e9 + self.to_unix, last_ns / 1e9 + self.to_unix
            out.append(SiteReading(
                _KIND, site.location, count, seconds=ns / 1e9,
                detail=f"num_workers={site.workers}"
                + (f", cores={cores}" if cores else ""), via=site.via,
                first_seen_unix=first, last_seen_unix=last,
                phase=phase_of(first, last, count, steps).value, occurrences=count))
        return out

    def clear(self) -> None:
        """Forgets the batches (the iterators keep their sites: zeroed, not dropped)."""
        for site in list(self.by_key.values()):
            site.tally = (0, 0, 0, 0)
