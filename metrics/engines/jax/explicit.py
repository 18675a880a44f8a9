"""Transfers the program asks for: ``jax.device_put`` and ``jax.device_get``
wrapped at install, each call's bytes and time recorded into
``TransferToDeviceTime``/``OutboundData`` and
``TransferFromDeviceTime``/``InboundData`` with an event per transfer.

The hot path (a numpy batch into ``device_put``, counted in the numpy shard
handler: :mod:`metrics.engines.jax.to_device`) writes one journal record,
and reads the clock twice on one put in 16 (:mod:`metrics.recording.sampling`);
pytrees are walked for their bytes: a put's host leaves, a get's
``jax.Array`` leaves (a get of numpy moves nothing and is no transfer). Implicit
transfers (``float(x)``, ``jnp.asarray(numpy)``) are
:mod:`metrics.engines.jax.implicit`' and never counted here too.

Example:
    >>> import jax, numpy as np, metrics                      # doctest: +SKIP
    >>> metrics.install(); jax.device_put(np.ones(4))  # counted  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from metrics.engines._patching import Patches
from metrics.engines.jax.context import TRANSFER_FIELDS, JaxContext
from metrics.engines.jax.gaps import GET
from metrics.engines.jax.startup import take_out
from metrics.recording import events as ev
from metrics.recording import sampling
from metrics.recording.journal import FOLD_AT
from metrics.recording.recorder import Recorder
from metrics.recording.registry import Distribution
from tpu_info.contract import catalog as names
from tpu_info.contract.model import EventKind


class ExplicitTransfers:
    """``device_put``/``device_get`` calls of one engine: the journal its
    wrappers write and the fold that turns records into readings."""

    def __init__(self, recorder: Recorder) -> None:
        self._startups: list[tuple[int, int]] = []  # the context's, once installed
        self.rec = recorder
        dist = recorder.distribution
        self._h2d_time = dist(names.TRANSFER_TO_DEVICE_TIME)
        self._d2h_time = dist(names.TRANSFER_FROM_DEVICE_TIME)
        self._outbound = dist(names.OUTBOUND_DATA)
        self._inbound = dist(names.INBOUND_DATA)
        self.journal = recorder.journal(self._fold)
        self.queue = self.journal.queue
        # Per time distribution, the mean of its last timed batch: what a
        # batch of only untimed puts is taken at.
        self._mean_ns: dict[Distribution, int] = {}

    def install(self, patches: Patches, context: JaxContext, put: bool = True
                ) -> tuple[Callable[..., Any], ...]:
        """Wraps ``jax.device_get`` and, when ``put``, ``jax.device_put``
        (counted while the context's active engine is this one's); returns
        the wrappers applied. Without ``put`` the numpy shard handler counts
        explicit puts (JAX marks them), one hook per put."""
        self._startups = context.startups  # taken out of a put that opened the device
        if put:
            patches.apply(jax, "device_put", lambda orig: _wrap_device_put(orig, context, self))
        patches.apply(jax, "device_get", lambda orig: _wrap_device_get(orig, context, self))
        return tuple(getattr(jax, n) for n in ("device_put", "device_get") if patches.has(n))

    def _fold(self, flat: list[Any]) -> None:
        """Transfer records (``TRANSFER_FIELDS`` items each) -> times, bytes
        and events (made when read). A record with ``end == 0`` was counted
        untimed (:mod:`metrics.recording.sampling`): its bytes count, its
        time is its side's timed ones', and its event takes the time of the
        timed record before it."""
        take_out(flat, TRANSFER_FIELDS, 1, 2, self._startups)
        to_device, starts = flat[0::TRANSFER_FIELDS], flat[1::TRANSFER_FIELDS]
        raw_ends, sizes = flat[2::TRANSFER_FIELDS], flat[3::TRANSFER_FIELDS]
        sampled = 0 in raw_ends
        ends = sampling.filled(raw_ends, time.monotonic_ns()) if sampled else raw_ends
        sides: tuple[tuple[Distribution, Distribution, list[int], list[int], list[int],
                           list[int]], ...]
        if all(to_device):  # the usual batch: every record a device_put
            sides = ((self._h2d_time, self._outbound, starts, ends, raw_ends, sizes),)
        else:
            pick, back = itertools.compress, [not t for t in to_device]
            sides = tuple(
                (time_d, bytes_d, list(pick(starts, mask)), list(pick(ends, mask)),
                 list(pick(raw_ends, mask)), list(pick(sizes, mask)))
                for time_d, bytes_d, mask in ((self._h2d_time, self._outbound, to_device),
                                              (self._d2h_time, self._inbound, back)))
        for time_d, bytes_d, s, e, raw, b in sides:
            if not e:
                continue
            bytes_d.observe_many(b, e)
            if not sampled or 0 not in raw:
                durations = list(map(operator.sub, e, s))
                time_d.observe_many(durations, e)
                self._mean_ns[time_d] = sum(durations) // len(durations)
                continue
            t = sampling.timed([time_d] * len(raw), s, raw, {time_d})
            if t.durations:
                time_d.observe_weighted(t.durations, t.weights, t.ends)
                self._mean_ns[time_d] = sum(t.durations) // len(t.durations)
            elif self._mean_ns.get(time_d):
                time_d.observe_weighted([self._mean_ns[time_d]], [len(e)], [e[-1]])
        self.rec.events.emit_batch(len(ends), functools.partial(
            _transfer_rows, to_device, ends, sizes, self.rec.mono_to_unix))


def _leaf_bytes(tree: object, to_device: bool) -> int:
    """The bytes a transfer of ``tree`` moves: its host leaves to the device
    (``device_put``), its ``jax.Array`` leaves from it (``device_get``); -1
    where no leaf moves (a put of device arrays, a get of numpy)."""
    if type(tree) is np.ndarray:  # fast path: the usual batch
        return tree.nbytes if to_device else -1
    total, moved = 0, False
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array) is to_device:
            continue
        moved = True
        nbytes = getattr(leaf, "nbytes", None)
        total += int(nbytes) if nbytes is not None else 8
    return total if moved else -1


def _transfer_rows(to_device: list[bool], ends: list[int], sizes: list[int], offset: float,
                   first: int) -> Iterable[tuple[Any, ...]]:
    """Event rows of a folded batch of transfers (made when first read)."""
    return ev.rows_of(first, [e / 1e9 + offset for e in ends],
                      [EventKind.TRANSFER_TO_DEVICE if t else EventKind.TRANSFER_FROM_DEVICE
                       for t in to_device],
                      [float(b) for b in sizes])


def _record_transfer(seen: ExplicitTransfers, to_device: bool, tree: object, start: int,
                     end: int) -> int:
    """The general case: pytrees, lists, scalars (walks the leaves). Returns
    the bytes recorded, or -1 where nothing moved (nothing recorded)."""
    try:
        nbytes = _leaf_bytes(tree, to_device)
    except Exception as e:  # noqa: BLE001 - a hook never raises into the program
        seen.rec.hook_failed("jax.transfer", e)
        return -1
    if nbytes < 0:
        return -1
    q = seen.queue
    q.extend((to_device, start, end, nbytes))
    if len(q) >= FOLD_AT * TRANSFER_FIELDS:
        seen.journal.flush()
    return nbytes


def _wrap_device_put(original: Callable[..., Any], context: JaxContext,
                     seen: ExplicitTransfers) -> Callable[..., Any]:
    # Runs on every batch: names bound once, no calls but the clock's.
    clock, ndarray = time.monotonic_ns, np.ndarray
    queue, flush = seen.queue, seen.journal.flush
    extend, fold_at = queue.extend, FOLD_AT * TRANSFER_FIELDS

    # jax.device_put(x, device=None, *, src=..., donate=..., may_alias=...):
    # the common call passes x (and a device) alone, which a plain positional
    # call forwards faster than *args/**kwargs.
    def device_put(x: Any, device: Any = None, **kwargs: Any) -> Any:
        eng = context.active
        if eng is None or eng.explicit is not seen:
            return original(x, device, **kwargs)
        start = clock()
        out = original(x, device, **kwargs) if kwargs else original(x, device)
        if type(x) is ndarray:  # the usual batch: inline, no walk
            extend((True, start, clock(), x.nbytes))
            if len(queue) >= fold_at:
                flush()
        else:
            _record_transfer(seen, True, x, start, clock())
        return out

    device_put.__wrapped__ = original  # type: ignore[attr-defined]
    device_put.__doc__ = original.__doc__
    return device_put


def _wrap_device_get(original: Callable[..., Any], context: JaxContext,
                     seen: ExplicitTransfers) -> Callable[..., Any]:
    clock = time.monotonic_ns

    def device_get(x: Any, *args: Any, **kwargs: Any) -> Any:
        eng = context.active
        if eng is None or eng.explicit is not seen:
            return original(x, *args, **kwargs)
        start = clock()
        out = original(x, *args, **kwargs)
        end = clock()
        # Only the input's device arrays move: a tree of numpy is no transfer
        # (jraph's pad_with_graphs gets numpy every step).
        nbytes = _record_transfer(seen, False, x, start, end)
        if nbytes < 0:
            return out
        try:  # its line, for the loop's gaps (a checkpoint's copy: gaps.py)
            eng.implicit.record(GET, sys._getframe(1), start, end, nbytes, "jax.device_get")
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            seen.rec.hook_failed("jax.gaps", e)
        return out

    device_get.__wrapped__ = original  # type: ignore[attr-defined]
    device_get.__doc__ = original.__doc__
    return device_get
