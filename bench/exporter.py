"""The host exporter's poll and scrape over 32 hooked processes against one, same run.

    python bench/exporter.py [--smoke]

Starts N server processes (32; 8 with --smoke) as ``bench/fanout.py`` does
(100 graphs, 20 distributions, a thread recording 10 times a second), writes
a discovery record for each into a private runtime directory, and alternates
a ``tpu-info exporter`` poll (discovery, one fan-out, the families of what
changed built and encoded, all merged) of all N with one of a directory
holding one record, then encodes the exposition whole (what every poll did
before it reused the unchanged families). Prints the medians, the ratio,
how many of the exposition's families a poll encoded, and its size.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import parser, verdict
from fanout import start_servers, stop_servers

from tpu_info.commands.exporter import ExporterOptions, HostExporter, _encode
from tpu_info.contract.model import LocalScan
from tpu_info.net.client import Client
from tpu_info.net.fanout import Channels, fan_out
from tpu_info.wire.delta import Follower


def _runtime_dir(root: Path, name: str, procs: list[subprocess.Popen[str]],
                 targets: list[str]) -> Path:
    d = root / name
    d.mkdir(mode=0o700)
    for p, target in zip(procs, targets, strict=True):
        host, _, port = target.rpartition(":")
        (d / f"{p.pid}.json").write_text(json.dumps({
            "schema": 1, "pid": p.pid, "port": int(port), "host": host.strip("[]"),
            "argv": ["bench_server.py"], "engine": "jax", "versions": {},
            "start_time": time.time()}))
    return d


def _fetch_both_ways(targets: list[str], rounds: int) -> tuple[float, float]:
    """Median seconds of the poll's fan-out with full answers and with
    cursors, alternating in the same rounds (each way its own followers)."""
    ways = [(Client.read, {t: Follower() for t in targets}, Channels(0)),
            (Client.read_latest, {t: Follower() for t in targets}, Channels())]
    times: list[list[float]] = [[], []]
    for r in range(rounds + 1):
        for i, (call, followers, channels) in enumerate(ways):
            t = time.perf_counter()
            fan_out(targets, timeout=10.0, call=call, followers=followers, channels=channels)
            if r:  # the first round: connections and first full answers
                times[i].append(time.perf_counter() - t)
        time.sleep(0.1)  # the processes record on, as between polls
    for _, _, channels in ways:
        channels.close()
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> int:
    args = parser(__doc__).parse_args()
    n = 8 if args.smoke else 32
    rounds = 3 if args.smoke else 15
    procs, targets = start_servers(n)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            def exporter(name: str, k: int) -> HostExporter:
                d = _runtime_dir(Path(tmp), name, procs[:k], targets[:k])
                return HostExporter(ExporterOptions(host_label="bench", runtime_dir=d,
                                                    timeout_s=10.0, libtpu_target=None),
                                    scan_chips=LocalScan)
            one, many = exporter("one", 1), exporter("many", n)
            for ex in (one, many):  # warm up: connections, imports, the format scraped
                ex.poll()
                ex.body("", "")
                ex.poll()
            alone, all_, encode, scrape, encoded = [], [], [], [], []
            for _ in range(rounds):
                t = time.perf_counter()
                one.poll()
                alone.append(time.perf_counter() - t)
                parts = many._encodings[""]
                before = parts.encoded
                t = time.perf_counter()
                many.poll()
                all_.append(time.perf_counter() - t)
                encoded.append(parts.encoded - before)
                t = time.perf_counter()
                body = many.body("", "")[0]
                scrape.append(time.perf_counter() - t)
                t = time.perf_counter()
                _encode(many._families, "", False)  # whole: as every poll did before reuse
                encode.append(time.perf_counter() - t)
            text = body.decode()
            up = [line for line in text.splitlines() if line.startswith("tpu_info_target_up{")]
            down = sum(1 for line in up if not line.endswith(" 1.0"))
            lines = text.count("\n")
            a, m, e, sc = (statistics.median(x) for x in (alone, all_, encode, scrape))
            total = len(many._encodings[""]._last[0])  # type: ignore[index]
            print(f"poll of one process: median {a * 1e3:.1f} ms; of {n}: median "
                  f"{m * 1e3:.1f} ms, encoding the families that changed (median "
                  f"{statistics.median(encoded):.0f} of {total} a poll); "
                  f"encoding the whole exposition ({len(body) / 1024:.0f} KiB, "
                  f"{lines:,} lines), as every poll did before: {e * 1e3:.1f} ms "
                  f"({rounds} rounds; {len(up) - down} of {len(up)} up; load average "
                  f"{os.getloadavg()[0]:.1f})")
            print(f"a scrape of the {n}-process exporter (served from the last poll): "
                  f"median {sc * 1e3:.2f} ms")
            full, cursor = _fetch_both_ways(targets, rounds)
            print(f"the poll's fan-out over {n} processes, side by side: full answers "
                  f"(Client.read, a new channel per target each round: before cursors) median "
                  f"{full * 1e3:.1f} ms, cursor answers (Client.read_latest, one follower and "
                  f"one channel kept per process: what the poll asks) "
                  f"{cursor * 1e3:.1f} ms ({full / cursor:.1f}x less); load average "
                  f"{os.getloadavg()[0]:.1f}")
            for ex in (one, many):
                ex.stop()  # closes its channels before the servers stop
            verdict(f"ratio poll({n}) / poll(1)", m / a, "informational", True)
    finally:
        stop_servers(procs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
