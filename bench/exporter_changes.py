"""The host exporter's poll against how much changed since the last one.

    python bench/exporter_changes.py [--smoke]

Starts N hooked server processes (32; 8 with --smoke), each with 100 graphs
and 20 distributions as ``bench/fanout.py``'s, which record only when told:
before each poll, every process observes one sample into k of its 20
distributions (k = 0, 1, 5, 20). A poll builds the histograms of the
changed distributions only and encodes only the families that changed, so
its cost follows k (before that reuse, every poll cost what k = 20 costs).
Prints the median poll (wall, and the CPU of the polling thread) per k.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, SERVER_PRELUDE, parser, verdict
from exporter import _runtime_dir
from fanout import stop_servers

from tpu_info.commands.exporter import ExporterOptions, HostExporter
from tpu_info.contract.model import LocalScan

SERVER = SERVER_PRELUDE + r"""
print(json.dumps({"address": ex.address}), flush=True)
for line in sys.stdin:  # k: observe into k distributions, then say so
    for d in rng.sample(dists, int(line)):
        d.observe(rng.lognormvariate(13, 1.0))
    print("ok", flush=True)
ex.stop(grace=0)
"""

CHANGED = (0, 1, 5, 20)


def main() -> int:
    args = parser(__doc__).parse_args()
    n = 8 if args.smoke else 32
    rounds = 3 if args.smoke else 5
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(n)]
    try:
        targets = [json.loads(p.stdout.readline())["address"] for p in procs]  # type: ignore[union-attr]
        with tempfile.TemporaryDirectory() as tmp:
            ex = HostExporter(ExporterOptions(
                host_label="bench", runtime_dir=_runtime_dir(Path(tmp), "run", procs, targets),
                timeout_s=10.0, libtpu_target=None), scan_chips=LocalScan)
            ex.poll()
            ex.body("", "")  # a scraper asked: every poll encodes the text format
            ex.poll()
            medians = {}
            for k in CHANGED:
                wall, cpu = [], []
                for _ in range(rounds):
                    for p in procs:
                        p.stdin.write(f"{k}\n")  # type: ignore[union-attr]
                        p.stdin.flush()  # type: ignore[union-attr]
                    for p in procs:
                        p.stdout.readline()  # type: ignore[union-attr]
                    time.sleep(0.06)  # past the servers' build cache
                    t, c = time.perf_counter(), time.thread_time()
                    ex.poll()
                    wall.append(time.perf_counter() - t)
                    cpu.append(time.thread_time() - c)
                medians[k] = statistics.median(wall)
                print(f"{k:2d} of 20 distributions changed in each of {n} processes: poll "
                      f"median {medians[k] * 1e3:.0f} ms, the polling thread's CPU "
                      f"{statistics.median(cpu) * 1e3:.0f} ms ({rounds} rounds; load average "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
            ex.stop()
        verdict("ratio poll(1 changed) / poll(20 changed)", medians[1] / medians[20],
                "informational", True)
    finally:
        stop_servers(procs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
