"""The arithmetic of a gap's own time (:mod:`~metrics.engines.jax.gaps`):
the device's work left on the training steps queued before it, a wait past
that queue, the gap's own time with the host's usual step and compiles out,
and whether its ``device_get`` copies were a checkpoint. Pure functions of
nanosecond figures; no JAX, no numpy (the hook's hot-path modules import
this)."""

from __future__ import annotations

from collections.abc import Callable

# The step's device-time samples can fall this far short of its period (1/8;
# drains.py: hk_transformer's were 89.7 % of it, 1/8.7 short) before a wait
# past the model's queue is taken as the gap's own work. (They read long as
# often on a loaded CPU, 10-45 %, hiding an evaluation in some gaps: 1/6
# hid a 23 ms one behind 31 steps of 1.3 ms, sampled 1.8, in one run of 6.)
UNSEEN_SHARE = 8
# A gap's device_gets are a checkpoint when they copy at least this share of
# the state the step carries from call to call (its parameters and optimizer
# state, fed back: calls.note_feedback); with that unknown, at least
# CHECKPOINT_MIN_BYTES. Less is a read of a loss or a few metrics (logging).
CHECKPOINT_STATE_SHARE = 0.1
CHECKPOINT_MIN_BYTES = 64 * 1024


def queued_ns(start: int, gap_start: int, steps: int, device_ns: int,
              first_wait: int) -> int:
    """The device's work left at ``gap_start`` on the ``steps`` training steps
    dispatched from ``start`` on (the step's previous call after a gap, or
    the end of the device work before it, if later), each ``device_ns`` on
    the device: at the earliest they end at ``start + steps * device_ns``;
    at most ``first_wait`` ns after the gap's start (its first wait had them
    done)."""
    return max(0, min(start + steps * device_ns - gap_start, first_wait))


def unseen_ns(first: int, queued: int, later: int) -> int:
    """The wait of a gap that called nothing the hook saw, past its queued
    steps: its first wait beyond their queue taken at the top of what their
    device samples allow (``queued``: :func:`queued_ns` at
    :func:`top_ns`), and its ``later`` waits (the queue was done: they
    waited for work sent in the gap). Device work the gap sent by no call
    the hook saw (eager ops JAX runs in C++ after their first call) where
    more than the usual step and the sync's latency.

    Example:
        >>> unseen_ns(first=30, queued=20, later=0)
        10
        >>> unseen_ns(first=10, queued=10, later=190)
        190
    """
    return max(0, first - queued) + later


def top_ns(device_ns: int, upper_ns: int | None) -> int:
    """The step's device ns per execution a wait past the queued steps is
    judged against: its samples' median ``device_ns`` and an eighth (they
    can fall short of the period: :data:`UNSEEN_SHARE`), or their upper
    quartile ``upper_ns`` where they spread wider (a loaded machine, whose
    steps between two reads can all run at the top of the spread: a print
    every 20 steps at load 10 waited 1.0-2.3 s for a queue of 1.36 s at the
    median, 2.4 s at the upper quartile, and was said as device work the
    gap sent in 3 of 6 gaps). A queue that even at this rate ended before
    the gap began leaves its whole wait to the gap.

    Example:
        >>> top_ns(80, None), top_ns(80, 84), top_ns(80, 120)
        (90, 90, 120)
    """
    return max(device_ns + device_ns // UNSEEN_SHARE, upper_ns or 0)


def own_ns(wall: int, queued: int, usual: int, compiles: int) -> int:
    """A gap's own cost: its wall time less what it would have taken anyway,
    the device's ``queued`` work or (overlapping it) the host's ``usual``
    step and the ``compiles`` in it; between 0 and ``wall``."""
    return max(0, min(wall, wall - max(queued, usual + compiles)))


def copies_state(nbytes: int, state_bytes: int) -> bool:
    """Whether a gap's device_gets of ``nbytes`` in all copied the step's
    state (``state_bytes``; 0: not known), as a checkpoint does.

    Example:
        >>> copies_state(4, 2_000_000), copies_state(700_000, 2_000_000)
        (False, True)
    """
    if state_bytes > 0:
        return nbytes >= CHECKPOINT_STATE_SHARE * state_bytes
    return nbytes >= CHECKPOINT_MIN_BYTES


def net_ns(wall: int, start: int, queued: int, usual: int, compiles: int,
           within: Callable[[int, int], int] | None) -> int:
    """A gap's own time (:func:`own_ns`) where the ``compiles`` in it that
    ran after its ``queued`` work's end (on an idle device; ``within``: the
    compile ns in a span) are out of it whole, not overlapped with the
    queue (flax's seq2seq: a read waited 684 ms for the queued steps, then
    decode compiled 1.2 s)."""
    after = compiles - within(start, start + queued) if compiles and queued and within else 0
    return max(0, own_ns(wall, queued, usual, compiles - after) - after)


def settled_ns(raw: tuple[int, int, int, int, int, int, int], device_ns: int | None,
               within: Callable[[int, int], int] | None) -> int:
    """The own time of a gap that sent device work of its own before its
    first wait, closed while the step's device time was not yet measured:
    ``raw`` its (wall, first wait, start, steps queued, their start, usual
    step, compiles), costed with the step's device time now, ``device_ns``
    (None: still unmeasured: the queue unknown, the wall stays in, an upper
    bound the views say). optax's nanolm example: an evaluation every 20
    steps of 277 ms, 7 of them sampled by the end but under 5 at the first
    gap, said 8.1 s each where the program's own timer says 0.12 s."""
    wall, first, start, n, base, usual, compiles = raw
    queued = queued_ns(base, start, n, device_ns, first) if device_ns is not None else 0
    return net_ns(wall, start, queued, usual, compiles, within)

