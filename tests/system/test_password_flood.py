"""Another client's wrong passwords never lock the owner out (issue 42 item 3).

The hook's ``/metrics`` with basic auth (real bcrypt, cost 10). Eight
threads of one client identity (127.0.0.1, user ``alice``) send wrong
passwords, each a new one, as fast as they are answered; meanwhile the
owner's scraper (user ``prometheus``, right password) scrapes once a second.
Every owner scrape must answer 200, the first one included; the flood is
told 429 with ``Retry-After`` once its own budget is spent. Before, one
budget of 2 checks a second served every client: the owner's first login
took 16-20 s of 401s, and each time the 60 s memory of its password ran out
it was locked out again.
"""

from __future__ import annotations

import base64
import itertools
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import bcrypt
import pytest

from metrics.export import prometheus as prom
from tests.conftest import patient
from tests.metrics.export.test_prometheus import make_snapshot

pytestmark = pytest.mark.slow

FLOOD_THREADS = 8
OWNER_SCRAPES = 15


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _get(url: str, auth: str, timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Retry-After") or ""
    except (urllib.error.URLError, OSError) as e:
        return 0, repr(e)


def test_the_owner_scrapes_through_another_clients_password_flood(tmp_path: Path):
    web = tmp_path / "web.yml"
    web.write_text(textwrap.dedent(f"""
        basic_auth_users:
          prometheus: "{bcrypt.hashpw(b"owner-secret", bcrypt.gensalt(10)).decode()}"
          alice: "{bcrypt.hashpw(b"alice-secret", bcrypt.gensalt(10)).decode()}"
    """))
    timeout = patient(10)
    with prom.start_http(make_snapshot, port=0, environ={}, web_config=web) as hook:
        url = f"http://127.0.0.1:{hook.port}/metrics"
        stop = threading.Event()
        flood: Counter[int] = Counter()
        retry_after: set[str] = set()
        guesses = itertools.count()
        lock = threading.Lock()

        def attack() -> None:
            while not stop.is_set():
                status, extra = _get(url, _basic("alice", f"guess-{next(guesses)}"), timeout)
                with lock:
                    flood[status] += 1
                    if status == 429:
                        retry_after.add(extra)

        threads = [threading.Thread(target=attack, daemon=True) for _ in range(FLOOD_THREADS)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + patient(30)
            while flood[429] < 10:  # the flood has spent its budget before the owner comes
                assert time.monotonic() < deadline, dict(flood)
                time.sleep(0.1)
            owner = []
            for i in range(OWNER_SCRAPES):
                if i:
                    time.sleep(1.0)
                started = time.monotonic()
                status, extra = _get(url, _basic("prometheus", "owner-secret"), timeout)
                owner.append((status, round(time.monotonic() - started, 2), extra))
        finally:
            stop.set()
            for t in threads:
                t.join(timeout + 5)
    print(f"owner scrapes {[s for s, _, _ in owner].count(200)}/{len(owner)} answered 200; "
          f"first in {owner[0][1]} s; the flood: {dict(flood)}")
    assert [s for s, _, _ in owner] == [200] * OWNER_SCRAPES, owner
    assert flood[429] >= 10 and flood[401] >= 1, dict(flood)
    assert retry_after and all(r.isdigit() and int(r) >= 1 for r in retry_after), retry_after
