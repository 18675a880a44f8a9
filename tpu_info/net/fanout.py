"""Many targets at once: :func:`fan_out` asks every target concurrently
within one deadline, so a slow, dead or flooding target fails on its own
and the round still ends in time. Each target's
:class:`~tpu_info.wire.delta.Follower` is kept between rounds, so a round
asks only for what changed since the last one, and its channel
(:class:`Channels`), so a round dials only targets that failed or are new.

Example:
    >>> for r in fan_out(["h1:8431", "h2:8431"], timeout=2.0):  # doctest: +SKIP
    ...     print(r.target, r.error or r.value.last_seq)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Generic, TypeVar

from tpu_info.contract.errors import TimedOut, TpuInfoError
from tpu_info.net.client import DEFAULT_TIMEOUT_S, Client
from tpu_info.wire import delta

T = TypeVar("T")

FAN_OUT_MARGIN_S = 0.5


@dataclass(frozen=True, slots=True)
class FanOutResult(Generic[T]):
    """One target's answer: ``value`` or ``error`` (exactly one is set)."""

    target: str
    value: T | None = None
    error: TpuInfoError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


# Each target's follower (decode cache and last whole snapshot), kept between
# fan-out rounds (a watch loop asks the same targets again and again); the
# most recently asked targets only.
_ROUND_FOLLOWERS: OrderedDict[str, delta.Follower] = OrderedDict()
_ROUND_FOLLOWERS_MAX = 64
_round_followers_lock = threading.Lock()


def _follower(target: str) -> delta.Follower:
    with _round_followers_lock:
        kept = _ROUND_FOLLOWERS.pop(target, None) or delta.Follower()
        _ROUND_FOLLOWERS[target] = kept
        while len(_ROUND_FOLLOWERS) > _ROUND_FOLLOWERS_MAX:
            _ROUND_FOLLOWERS.popitem(last=False)
        return kept


class Channels:
    """Clients kept open between rounds, one per target, at most ``bound``
    (the least recently asked closed first). A client is taken out while
    a round uses it and put back only after it answered, so no two threads
    share one (a call still running after its round keeps its own) and a
    target that failed is dialled afresh next time.
    """

    def __init__(self, bound: int = 64) -> None:
        self.bound = bound
        self._idle: OrderedDict[str, Client] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, target: str) -> Client | None:
        with self._lock:
            return self._idle.pop(target, None)

    def put(self, client: Client) -> None:
        with self._lock:
            old = self._idle.pop(client.target, None)
            self._idle[client.target] = client
            evicted = [self._idle.popitem(last=False)[1]
                       for _ in range(len(self._idle) - self.bound)]
        if old is not None and old is not client:
            old.close()
        for c in evicted:  # this one too when the bound is 0
            c.close()

    def keep_only(self, targets: set[str]) -> None:
        """Closes the clients of targets not in ``targets``."""
        with self._lock:
            gone = [self._idle.pop(t) for t in list(self._idle) if t not in targets]
        for c in gone:
            c.close()

    def close(self) -> None:
        self.keep_only(set())


_ROUND_CHANNELS = Channels(_ROUND_FOLLOWERS_MAX)


def _ask(target: str, timeout: float, deadline: float, call: Callable[[Client], T],
         follower: delta.Follower | None, channels: Channels,
         min_wait: float = 0.0, ends: dict[str, float] | None = None) -> FanOutResult[T]:
    started = time.monotonic()
    follower = follower if follower is not None else _follower(target)
    client = channels.take(target)
    try:
        if client is None:
            client = Client(target, timeout=timeout, deadline=deadline, follower=follower)
        if min_wait > 0:  # asked late (a starved thread): still a real wait
            deadline = max(deadline, time.monotonic() + min_wait)
            timeout = max(timeout, min_wait)
            if ends is not None:
                ends[target] = deadline
        client.renew(timeout, deadline, follower)
        value = call(client)
        channels.put(client)
        return FanOutResult(target, value=value, seconds=time.monotonic() - started)
    except TpuInfoError as e:
        if client is not None:
            client.close()
        return FanOutResult(target, error=e.with_target(target) if not e.target else e,
                            seconds=time.monotonic() - started)
    except BaseException:
        if client is not None:
            client.close()
        raise


def fan_out(
    targets: Sequence[str],
    timeout: float = DEFAULT_TIMEOUT_S,
    call: Callable[[Client], T] = Client.follow,  # type: ignore[assignment]
    max_workers: int = 32,
    followers: Mapping[str, delta.Follower] | None = None,
    channels: Channels | None = None,
    min_wait: float = 0.0,
) -> list[FanOutResult[T]]:
    """Asks every target at once; returns one result per target, in order.

    The whole round, every call and the decoding of every reply included,
    ends within ``timeout`` (plus a small margin), however many targets hang
    or send replies too large to decode in time: a target that does not
    finish yields :class:`TimedOut` while the others' answers are kept.

    Args:
        targets: ``host:port`` addresses.
        timeout: seconds allowed for the round.
        call: what to ask each :class:`Client` (default: :meth:`Client.follow`,
            the whole snapshot with only what changed sent).
        max_workers: threads used at most.
        followers: each target's :class:`~tpu_info.wire.delta.Follower`
            (default: kept here for the 64 targets asked last).
        channels: the clients kept open between rounds (default: kept here
            for the 64 targets asked last).
        min_wait: seconds each target's request waits at least, counted
            from when it is sent, though the round's ``timeout`` ends sooner
            (the CLI on a loaded machine: a thread that got its turn late
            still gives its target a real wait); the round is longer then.
    """
    if not targets:
        return []
    deadline = time.monotonic() + timeout
    pool = futures.ThreadPoolExecutor(max_workers=min(max_workers, len(targets)),
                                      thread_name_prefix="tpu-info-fanout")
    try:
        kept = followers or {}
        open_ = channels if channels is not None else _ROUND_CHANNELS
        ends: dict[str, float] = {}  # targets asked late, with min_wait: when they end
        pending = {pool.submit(_ask, t, timeout, deadline, call, kept.get(t), open_,
                               min_wait, ends): i
                   for i, t in enumerate(targets)}
        # Every call and decode carries the round's deadline; the margin
        # covers the thread hand-off and a connection probe, and guards
        # against anything that would ignore the deadline.
        done, left = futures.wait(pending, timeout=timeout + FAN_OUT_MARGIN_S)
        end = deadline
        while left and min_wait > 0:  # targets asked late end later
            later = max((ends.get(targets[pending[f]], end) for f in left), default=end)
            if later <= end:
                break
            end = later
            more, left = futures.wait(left, timeout=end - time.monotonic() + FAN_OUT_MARGIN_S)
            done |= more
        results: list[FanOutResult[T]] = []
        for fut, i in sorted(pending.items(), key=lambda kv: kv[1]):
            if fut in done:
                results.append(fut.result())
            else:
                fut.cancel()
                waited = ends.get(targets[i], deadline) - (deadline - timeout)
                results.append(FanOutResult(targets[i], error=TimedOut(
                    f"no answer within {waited:.3g}s", target=targets[i]), seconds=waited))
        return results
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
