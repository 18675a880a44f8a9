"""fan_out's ``min_wait``: a request sent when the round's time is (nearly)
gone still waits for its answer, counted from when it is sent; what the CLI
gives each target when a loaded machine's start took its --timeout."""

from __future__ import annotations

import time

from metrics import export
from tpu_info.contract.errors import TimedOut
from tpu_info.contract.model import Snapshot
from tpu_info.net.fanout import Channels, fan_out


def _slow(answer_after_s: float):  # type: ignore[no-untyped-def]
    def snapshot(since: int) -> Snapshot:
        time.sleep(answer_after_s)
        return Snapshot(taken_at_unix=3.0, last_seq=0)

    return export.start(snapshot, port=0)


def test_a_late_request_still_waits_min_wait() -> None:
    server = _slow(0.6)
    try:
        started = time.monotonic()
        late = fan_out([server.address], timeout=0.05, min_wait=2.0, channels=Channels())
        took = time.monotonic() - started
    finally:
        server.stop(grace=0)
    server = _slow(0.6)  # a fresh one: a server keeps its last answer a while
    try:
        cut = fan_out([server.address], timeout=0.05, channels=Channels())
    finally:
        server.stop(grace=0)
    assert late[0].ok, late[0].error
    assert late[0].value.taken_at_unix == 3.0
    assert took < 2.0 + 1.0  # answered in 0.6 s: the round ends with its answer
    assert isinstance(cut[0].error, TimedOut)  # without it: the round's 50 ms


def test_min_wait_ends_a_round_whose_target_never_answers() -> None:
    server = _slow(30.0)
    try:
        started = time.monotonic()
        r = fan_out([server.address], timeout=0.05, min_wait=1.0, channels=Channels())
        took = time.monotonic() - started
    finally:
        server.stop(grace=0)
    assert isinstance(r[0].error, TimedOut), r[0]
    assert 0.9 <= took < 1.0 + 1.5, took
