"""A reader polling a busy program gets every event number (issue 42, item 7).

A real JAX program (CPU) runs a busy loop (a step, data both ways and
``mark_step`` each time, a new shape every 20 steps: a compile) and serves
its metrics, from the helper process (``serve=process``, the default) or a
thread in the program (``serve=thread``). A client reads its events for
about 3 s at a watcher's pace, through the path each command uses:

- ``profile``: :func:`tpu_info.net.capture_events._read` into a
  :class:`~tpu_info.net.capture_events.Seen`, asking with the newest event
  number read (``tpu-info profile``'s reading beside its capture);
- ``watch``: :meth:`Client.read_latest` (``--watch``, the TUI, the
  exporter), a cursor on the last whole snapshot; the events it got are
  those of each answer above the previous answer's ``last_seq``.

Then the program stops emitting and the reader reads until it has caught
up with the program's ``last_seq``. Every number from the first one read
to that ``last_seq`` must have come: a reply says nothing of events
dropped (a snapshot has ``last_seq`` and its events, no count of those
left out), so a gap is an event lost between the hook and the reader.
The program's pace keeps each poll well under a reply's 1,000 events (the
rings hold 10,000), so nothing here is cut by design.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, patient
from tpu_info.contract.model import Event

pytestmark = pytest.mark.slow

READ_FOR_S = 3.0  # how long the reader polls the busy program
POLL_S = 0.15  # a watcher's pace (profile reads every 0.2 s, --watch every 1 s or less)

PROGRAM = r"""
import json, sys, threading, time
import jax, jax.numpy as jnp, numpy as np, metrics
metrics.install(engines=["jax"])
busy, done = threading.Event(), threading.Event()
busy.set()
def commands():
    for line in sys.stdin:
        busy.clear()  # "pause": stop emitting, say so once the loop has stopped
    done.set()
threading.Thread(target=commands, daemon=True).start()
step = jax.jit(lambda x: (x * 2).sum())
print(json.dumps({"address": metrics.exporter().address}), flush=True)
n = 0
while busy.is_set():
    n += 1
    step(jnp.ones(8 + n // 20)).block_until_ready()  # a new shape every 20 steps: a compile
    jax.device_get(jax.device_put(np.arange(64.0)))  # host data both ways
    metrics.mark_step()
    time.sleep(0.005)
print(json.dumps({"paused_after_steps": n}), flush=True)
done.wait()
"""


class Program:
    def __init__(self, tmp_path: Path, serve: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
                   TPU_INFO_PORT="0", JAX_PLATFORMS="cpu", TPU_INFO_SERVE=serve)
        env.pop("TPU_INFO_AUTOINSTALL", None)
        self.proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            raise AssertionError(f"the program did not start: {self.proc.stderr.read()[-3000:]}")
        self.address: str = json.loads(line)["address"]

    def pause(self) -> int:
        """Stops the busy loop; returns how many steps it ran."""
        self.proc.stdin.write("pause\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["paused_after_steps"]

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=patient(60))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(params=["process", "thread"])
def program(request, tmp_path) -> Iterator[Program]:
    prog = Program(tmp_path, request.param)
    yield prog
    prog.stop()


class _Noting:
    """A client whose ``snapshot`` also notes the reply's ``last_seq`` (profile's
    :class:`Seen` keeps only the first one)."""

    def __init__(self, client) -> None:
        self.client, self.last_seq = client, 0

    def snapshot(self, events_since: int = 0, max_events: int = 0):
        snap = self.client.snapshot(events_since=events_since, max_events=max_events)
        self.last_seq = snap.last_seq
        return snap


class Reader:
    """One read path; ``got``: every event it was given; ``replies``: a line per read."""

    def __init__(self, client, path: str) -> None:
        from tpu_info.net.capture_events import Seen

        self.client, self.path = client, path
        self.noting = _Noting(client)
        self.seen = Seen()  # profile's
        self.cursor = 0  # watch's: the last whole snapshot's last_seq
        self.got: dict[int, Event] = {}
        self.last_seq = 0
        self.replies: list[tuple[int, int, int, int, int]] = []  # since, n, first, last, last_seq

    def read(self) -> None:
        from tpu_info.net.capture_events import _read

        if self.path == "profile":
            since = self.seen.cursor
            held = len(self.seen.events)
            assert _read(self.noting, self.seen, since), self.seen.error
            new = list(self.seen.events.values())[held:]  # a dict keeps its order
            self.last_seq = self.noting.last_seq
        else:
            since = self.cursor
            source, whole = self.client.read_latest()
            assert source == "hook", source
            new = [e for e in whole.events if e.seq > since]
            self.cursor = self.last_seq = whole.last_seq
        seqs = [e.seq for e in new]
        self.replies.append((since, len(seqs), min(seqs, default=0), max(seqs, default=0),
                             self.last_seq))
        for e in new:
            self.got[e.seq] = e

    def caught_up(self) -> bool:
        return bool(self.got) and max(self.got) >= self.last_seq


def _gaps(numbers: list[int]) -> list[tuple[int, int]]:
    """(first missing, last missing) runs between the lowest and highest number."""
    out = []
    for a, b in zip(numbers, numbers[1:]):
        if b != a + 1:
            out.append((a + 1, b - 1))
    return out


@pytest.mark.parametrize("path", ["profile", "watch"])
def test_a_reader_polling_a_busy_program_gets_every_event_number(program, path) -> None:
    from tpu_info.net.client import Client

    with Client(program.address, timeout=patient(30)) as client:
        reader = Reader(client, path)
        read = reader.read
        end = time.monotonic() + READ_FOR_S
        while time.monotonic() < end:
            read()
            time.sleep(POLL_S)
        steps = program.pause()
        # Caught up: every event the program made has been read (the helper's
        # mirror is at most 0.1 s old; a loaded machine may take longer).
        deadline = time.monotonic() + patient(60)
        read()
        while not reader.caught_up() and time.monotonic() < deadline:
            time.sleep(POLL_S)
            read()
    numbers = sorted(reader.got)
    kinds = {e.kind for e in reader.got.values()}
    trail = "\n".join(f"since {s}: {n} events {a}..{b}, last_seq {last}"
                      for s, n, a, b, last in reader.replies)
    assert reader.caught_up(), f"never caught up with last_seq {reader.last_seq}\n{trail}"
    assert steps >= 3 and len(reader.replies) >= 3, (steps, len(reader.replies))
    assert {"step", "transfer_to_device", "compile"} <= kinds, kinds
    # Nothing cut by a reply's 1,000: the pace this test means.
    assert max(n for _, n, *_ in reader.replies[1:]) < 1000, trail
    gaps = _gaps(numbers)
    missing = sum(b - a + 1 for a, b in gaps)
    assert not gaps, (f"{missing} of {numbers[-1] - numbers[0] + 1} event numbers "
                      f"{numbers[0]}..{numbers[-1]} never reached the reader; gaps "
                      f"{gaps[:20]}\n{trail}")
