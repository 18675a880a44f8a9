"""Checks ``Authorization: Basic`` headers against bcrypt hashes without
letting one client lock out another.

bcrypt at cost 10 takes 50-160 ms (and releases the GIL), so checks are
rationed, and what is rationed is per client, never one pool for all
(issue 42 item 3: with one shared budget another user's wrong passwords
gave the owner's Prometheus 401s for minutes):

- a header that passed is remembered while it is used: each use keeps it
  :data:`AUTH_IDLE_S` longer (a scrape every 15 s to 2 min never checks
  again); at most :data:`AUTH_CACHE_MAX`, the least recently used dropped;
- a header that failed is remembered too (:data:`FAILED_MAX`, least
  recently used dropped): sending the same wrong password again is a 401
  that costs no check and no budget;
- a check spends a token of its client: the peer address and the user
  name, when the name is one of the file's (every unknown name of one
  address shares one budget, so made-up names create no state): at most
  :data:`CHECKS_PER_S` a second (burst :data:`CHECK_BURST`); and of one
  ceiling for the process, :data:`CEILING_PER_S` (burst
  :data:`CEILING_BURST`), which one client's budget cannot reach;
- a header refused because its budget (or the ceiling) is spent is not
  checked: the answer is 429 with ``Retry-After`` (the seconds until a token
  is back), never 401, so the client is told to come back, not that its
  password is wrong.

The table of budgets holds :data:`MAX_CLIENTS`; a full budget is as good as
none, so those are dropped first; when every one is spent, a new client
shares one overflow budget. What one client can still do: spend its own
budget; what many (addresses on other hosts, with ``TPU_INFO_PROMETHEUS_BIND``,
or many 127.x.y.z addresses locally) can do: spend the ceiling, so that a new
login waits (429, Retry-After) while the flood lasts; a client already in
keeps its remembered header.

Example:
    >>> auth = BasicAuth({})
    >>> auth("Basic eDp5", "127.0.0.1").status
    401
"""

from __future__ import annotations

import base64
import hashlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import NamedTuple

AUTH_IDLE_S = 300.0  # a passed header is remembered this long after its last use
AUTH_CACHE_MAX = 64
FAILED_MAX = 256  # wrong headers remembered (a repeat costs no check)
CHECKS_PER_S = 2.0  # bcrypt checks a second per client (address, user name)
CHECK_BURST = 4.0
CEILING_PER_S = 8.0  # bcrypt checks a second for the process, all clients
CEILING_BURST = 8.0
MAX_CLIENTS = 256  # budgets held
UNKNOWN_USER = ""  # the budget key of every name not in the file
OVERFLOW = ("", UNKNOWN_USER)  # the budget of new clients while the table is full


class Verdict(NamedTuple):
    """What a request's ``Authorization`` header is worth.

    Attributes:
        status: 200 (in), 401 (wrong or missing), 429 (not checked: the
            client's budget is spent).
        retry_after_s: with 429, whole seconds until it may try again.
    """

    status: int
    retry_after_s: int = 0

    @property
    def ok(self) -> bool:
        return self.status == 200


PASSED = Verdict(200)
WRONG = Verdict(401)


class _Bucket:
    __slots__ = ("tokens", "last", "rate", "burst")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.last = rate, burst, burst, now

    def fill(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        return self.tokens

    def wait_s(self) -> int:
        """Whole seconds until a token is back (at least 1)."""
        return max(1, math.ceil((1.0 - self.tokens) / self.rate))


class BasicAuth:
    """Checks ``Authorization: Basic`` headers (see the module docstring).
    Thread-safe; the check itself runs outside the lock.

    Args:
        users: user -> bcrypt hash.
        clock: monotonic seconds (injected for tests).
        checker: ``checker(password, hash) -> bool`` (bcrypt's, injected for tests).
    """

    def __init__(self, users: Mapping[str, bytes], clock: Callable[[], float] = time.monotonic,
                 checker: Callable[[bytes, bytes], bool] | None = None) -> None:
        self._users = dict(users)
        self._clock = clock
        self._checker = checker
        self._passed: OrderedDict[bytes, float] = OrderedDict()  # header -> expiry
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self._budgets: dict[tuple[str, str], _Bucket] = {}
        self._ceiling = _Bucket(CEILING_PER_S, CEILING_BURST, clock())
        self._lock = threading.Lock()
        self._dummy = next(iter(self._users.values()), b"")
        self.checks = 0  # bcrypt checks run
        self.refused_busy = 0  # headers refused unchecked (429)

    def __call__(self, header: str, peer: str = "") -> Verdict:
        """What ``header`` (the ``Authorization`` value) sent from ``peer``
        (the client's address) is worth."""
        scheme, _, encoded = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return WRONG
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True) \
                .decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return WRONG
        if not sep:
            return WRONG
        key = hashlib.sha256(header.strip().encode("utf-8", "replace")).digest()
        now = self._clock()
        with self._lock:
            expiry = self._passed.get(key)
            if expiry is not None and expiry > now:
                self._passed[key] = now + AUTH_IDLE_S  # remembered while used
                self._passed.move_to_end(key)
                return PASSED
            if key in self._failed:
                self._failed.move_to_end(key)
                return WRONG
            budget = self._budget(peer, user if user in self._users else UNKNOWN_USER, now)
            if budget.fill(now) < 1.0:
                self.refused_busy += 1
                return Verdict(429, budget.wait_s())
            if self._ceiling.fill(now) < 1.0:
                self.refused_busy += 1
                return Verdict(429, self._ceiling.wait_s())
            budget.tokens -= 1.0
            self._ceiling.tokens -= 1.0
        ok = self._check(password.encode("utf-8"), self._users.get(user))
        with self._lock:
            if ok:
                self._passed[key] = now + AUTH_IDLE_S
                self._passed.move_to_end(key)
                while len(self._passed) > AUTH_CACHE_MAX:
                    self._passed.popitem(last=False)
            else:
                self._failed[key] = None
                while len(self._failed) > FAILED_MAX:
                    self._failed.popitem(last=False)
        return PASSED if ok else WRONG

    def _budget(self, peer: str, user: str, now: float) -> _Bucket:
        key = (peer, user)
        bucket = self._budgets.get(key)
        if bucket is not None:
            return bucket
        if len(self._budgets) >= MAX_CLIENTS:  # a full bucket is a fresh one: drop those
            for k in [k for k, b in self._budgets.items() if b.fill(now) >= b.burst]:
                del self._budgets[k]
        if len(self._budgets) >= MAX_CLIENTS:
            key = OVERFLOW
            bucket = self._budgets.get(key)
            if bucket is not None:
                return bucket
        bucket = self._budgets[key] = _Bucket(CHECKS_PER_S, CHECK_BURST, now)
        return bucket

    @property
    def clients(self) -> int:
        """Budgets held now."""
        return len(self._budgets)

    def _check(self, password: bytes, hashed: bytes | None) -> bool:
        self.checks += 1
        # An unknown user costs the same check (no telling users apart by time).
        try:
            if self._checker is not None:
                ok = self._checker(password, hashed or self._dummy)
            else:
                import bcrypt

                ok = bcrypt.checkpw(password, hashed or self._dummy)
        except ValueError:
            return False
        return ok and hashed is not None
