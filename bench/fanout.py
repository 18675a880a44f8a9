"""Fan-out: one round of snapshots from 32 monitored processes against one
target alone, same run.

    python bench/fanout.py [--smoke]

Starts N server processes (32; 8 with --smoke), each serving the real
``metrics.export`` server over a recorder holding 100 graphs and 20
distributions, into which a thread keeps recording as a training program
would (10 times a second: a sample into one distribution, an execution of
one graph, a step event), so each answer is built fresh and part of it
changed since the previous round. Then alternates ``fan_out(all N)`` with
``fan_out([one])``, each both ways, side by side in the same rounds: full
answers (``Client.snapshot``: every part and every kept event, what fan-out
asked before cursors) and cursor answers (``Client.follow``, fan-out's
default: only the new events and the changed parts, merged into each
target's last whole snapshot), the latter both with a new channel per
target each round (as before) and with channels kept between rounds
(fan-out's default). Prints the medians and the ratio of each path.
Target: ratio <= 2.

It also prints two floors under each ratio, from what it measures: the CPU
a round needs spread over this machine's cores, and the decoding of each
answer (full and cursor, side by side), which a one-process Python client
does holding the GIL, one answer at a time, however many cores there are.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
from _common import ROOT, SERVER_PRELUDE, parser, verdict

from tpu_info.net.client import Client, _with_cursor
from tpu_info.net.fanout import Channels, FanOutResult, fan_out
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire
from tpu_info.wire import delta

SERVER = SERVER_PRELUDE + r"""
def train():
    while True:
        time.sleep(0.1)
        rng.choice(dists).observe(rng.lognormvariate(13, 1.0))
        i = rng.randrange(100)
        rec.ledger.executed(f"{i:064x}", f"jit(f{i})", "jax")
        rec.events.emit("step", value=1.0)
threading.Thread(target=train, daemon=True).start()
print(json.dumps({"address": ex.address}), flush=True)
sys.stdin.read()
ex.stop(grace=0)
"""


def start_servers(n: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """Starts ``n`` hooked server processes (each recording) and returns them
    with their addresses; says how long that took and the load average."""
    t0 = time.perf_counter()
    procs, addresses = _start(n)
    print(f"started {n} server processes in {time.perf_counter() - t0:.1f}s; "
          f"load average {os.getloadavg()[0]:.1f}")
    return procs, addresses


def _start(n: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(n)]
    addresses = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("a server process did not start")
        addresses.append(json.loads(line)["address"])
    return procs, addresses


def stop_servers(procs: list[subprocess.Popen[str]]) -> None:
    """Ends what :func:`start_servers` started: stdin closed (each server stops
    itself), then a kill for any that has not within 10 s."""
    for p in procs:
        if p.stdin is not None:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()

def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def _decode_seconds(target: str, times: int = 30) -> tuple[float, float, float]:
    """Median seconds to turn one answer of ``target`` into a whole snapshot:
    a full answer from scratch, a full answer as a client that decoded the
    previous one does, and a cursor answer merged into the last whole one
    (the two asked alternately, as between rounds)."""
    cold, warm, cursor = [], [], []
    cache, follower = wire.DecodeCache(), delta.Follower()
    with Client(target, timeout=10) as client:
        for _ in range(times):
            msg = client._monitor.GetSnapshot(pb.SnapshotRequest(), timeout=10)
            t = time.perf_counter()
            wire.snapshot_from_proto(msg)
            t1 = time.perf_counter()
            wire.snapshot_from_proto(msg, cache)
            warm.append(time.perf_counter() - t1)
            cold.append(t1 - t)
            held = follower.held
            msg = client._monitor.GetSnapshot(_with_cursor(pb.SnapshotRequest(), held),
                                              timeout=10)
            t = time.perf_counter()
            answer = wire.snapshot_from_proto(msg, follower.parts)
            follower.apply(answer, delta.stamp_of(msg), held)
            if held is not None:
                cursor.append(time.perf_counter() - t)
            time.sleep(0.05)  # the server records on meanwhile, as between rounds
    return statistics.median(cold), statistics.median(warm), statistics.median(cursor)


class _Path:
    """One way of asking (full or cursor answers): its rounds and CPU."""

    def __init__(self, name: str, call: Callable[[Client], object], keep: bool) -> None:
        self.name, self.call = name, call
        self.followers: dict[str, delta.Follower] = {}
        self.channels = Channels(64 if keep else 0)  # 0: a new channel every round
        self.alone: list[float] = []
        self.all: list[float] = []
        self.cpu_client = self.cpu_servers = 0.0

    def round(self, targets: list[str], me: psutil.Process,
              servers: list[psutil.Process]) -> list[FanOutResult[object]]:
        t = time.perf_counter()
        one = fan_out(targets[:1], timeout=10, call=self.call, followers=self.followers,
                      channels=self.channels)
        self.alone.append(time.perf_counter() - t)
        c0, s0 = _cpu([me]), _cpu(servers)
        t = time.perf_counter()
        many = fan_out(targets, timeout=10, call=self.call, followers=self.followers,
                       channels=self.channels)
        self.all.append(time.perf_counter() - t)
        self.cpu_client += _cpu([me]) - c0
        self.cpu_servers += _cpu(servers) - s0
        return [r for r in one + many if not r.ok]

    def report(self, n: int, rounds: int) -> tuple[float, float]:
        a, m = statistics.median(self.alone), statistics.median(self.all)
        cores = len(os.sched_getaffinity(0))
        per_round = (self.cpu_client + self.cpu_servers) / rounds
        print(f"{self.name}: one target alone: median {a * 1e3:.1f} ms; all {n}: median "
              f"{m * 1e3:.1f} ms; ratio {m / a:.1f}x. CPU per all-{n} round: client "
              f"{self.cpu_client / rounds * 1e3:.1f} ms ({self.cpu_client / rounds / n * 1e3:.2f}"
              f" ms per target: channel, call, decode), servers "
              f"{self.cpu_servers / rounds * 1e3:.1f} ms; on {cores} cores no schedule ends a "
              f"round under {per_round / cores * 1e3:.1f} ms = {per_round / cores / a:.1f}x "
              "one target alone")
        return a, m


def main() -> int:
    args = parser(__doc__).parse_args()
    n = 8 if args.smoke else 32
    rounds = 5 if args.smoke else 30
    procs, targets = start_servers(n)
    paths: list[_Path] = []
    try:
        paths = [_Path("full answers, new channels (before)", Client.snapshot, keep=False),
                 _Path("cursor answers, new channels", Client.follow, keep=False),
                 _Path("cursor answers, channels kept (fan-out's default)", Client.follow,
                       keep=True)]
        for _ in range(2):  # warm up (first connections, imports, each path's cursors)
            for path in paths:
                fan_out(targets, timeout=10, call=path.call, followers=path.followers,
                        channels=path.channels)
        me = psutil.Process()
        servers = [psutil.Process(p.pid) for p in procs]
        for _ in range(rounds):
            for path in paths:
                failed = path.round(targets, me, servers)
                if failed:
                    print(f"failed: {failed[0].target}: {failed[0].error}")
                    return 1
        print(f"{rounds} rounds, the paths alternating; load average "
              f"{os.getloadavg()[0]:.1f}")
        (a_full, m_full), (a_new, m_new), (a_cur, m_cur) = (p.report(n, rounds) for p in paths)
        cold, warm, cursor = _decode_seconds(targets[0])
        print(f"decoding one answer holds the GIL: full {warm * 1e3:.3f} ms ({cold * 1e3:.2f} ms "
              f"for a first answer), cursor {cursor * 1e3:.3f} ms ({warm / cursor:.1f}x less): a "
              f"one-process Python client ends no round under one target alone + {n - 1} "
              f"decodes = {1 + (n - 1) * warm / a_full:.1f}x with full answers, "
              f"{1 + (n - 1) * cursor / a_cur:.1f}x with cursors, on any number of cores")
        print(f"fan-out ratio ({n} vs 1): full answers {m_full / a_full:.1f}x, cursor answers "
              f"{m_new / a_new:.1f}x, with channels kept {m_cur / a_cur:.1f}x; a round of {n}: "
              f"{m_full * 1e3:.1f} -> {m_new * 1e3:.1f} -> {m_cur * 1e3:.1f} ms")
        verdict(f"ratio fan-out({n}) / one, cursor answers", m_cur / a_cur, "<= 2",
                m_cur / a_cur <= 2.0)
    finally:
        for path in paths:  # before the servers stop: no GOAWAY to log
            path.channels.close()
        stop_servers(procs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
