"""`tpu-info exporter` over 1,000 live-process records at dead ports and one real program.

    python bench/exporter_records.py [--smoke] [--records N] [--polls K]

Writes ``--records`` discovery records (1,000; 200 with --smoke) whose pids
are alive (the threads of one sleeping helper process: ``kill(tid, 0)``
and ``/proc/<tid>`` answer for a thread as for a process, so the reader
takes each for a live hooked process) and whose ports nothing serves: half
refuse connections, half accept them and never answer (a hung program).
Then starts one real hooked program (``bench/fanout.py``'s server) after
them, its record last, and runs ``tpu-info exporter --interval 2.5
--timeout 2`` as a subprocess over that directory. For ``--polls`` polls
(4) it scrapes ``/metrics`` once a poll and reports: whether the real
program had its series and ``tpu_info_target_up 1`` (before: never, it
was past "the first 256"), the poll's duration against ``--timeout``, the
exporter's open fds and RSS, and what ``tpu_info_exporter_targets_skipped``
says was not asked.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import ROOT, parser, verdict
from fanout import start_servers, stop_servers

HOLDER = r"""
import json, sys, threading
threading.stack_size(64 * 1024)
stop = threading.Event()
ids = []
ready = threading.Semaphore(0)
def hold():
    ids.append(threading.get_native_id())
    ready.release()
    stop.wait()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=hold, daemon=True).start()
for _ in range(int(sys.argv[1])):
    ready.acquire()
print(json.dumps(ids), flush=True)
sys.stdin.read()
"""


def _holder(n: int) -> tuple[subprocess.Popen[str], list[int]]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(n)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, json.loads(p.stdout.readline())


def _dead_ports(k: int) -> tuple[list[int], list[socket.socket]]:
    """``k`` ports that refuse connections and ``k`` that accept and never answer."""
    refusing, hung = [], []
    for _ in range(k):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        refusing.append(s.getsockname()[1])
        s.close()
        h = socket.socket()
        h.bind(("127.0.0.1", 0))
        h.listen(4096)  # accepted by the kernel, never read: a hung program
        hung.append(h)
    return refusing + [h.getsockname()[1] for h in hung], hung


def _record(d: Path, pid: int, port: int, argv: list[str]) -> None:
    path = d / f"{pid}.json"
    path.write_text(json.dumps({"schema": 1, "pid": pid, "port": port, "host": "127.0.0.1",
                                "argv": argv, "engine": "jax", "versions": {},
                                "start_time": time.time()}))
    path.chmod(0o600)


def _value(text: str, pattern: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(pattern + r"[^\n]* ([-+0-9.e]+)\n", text)]


def _proc(pid: int) -> tuple[int, float]:
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return fds, rss


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--polls", type=int, default=None)
    args = ap.parse_args()
    n = args.records or (200 if args.smoke else 1000)
    args.polls = args.polls or (2 if args.smoke else 4)
    interval, timeout = 2.5, 2.0
    holder, tids = _holder(n)
    ports, hung = _dead_ports(8)
    procs: list[subprocess.Popen[str]] = []
    exporter = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "rt"
            d.mkdir(mode=0o700)
            for i, tid in enumerate(tids):
                _record(d, tid, ports[i % len(ports)], ["stale.py"])
            time.sleep(0.05)
            procs, targets = start_servers(1)
            real_pid = procs[0].pid
            _record(d, real_pid, int(targets[0].rpartition(":")[2]), ["real_program.py"])
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            exporter = subprocess.Popen(
                [sys.executable, "-m", "tpu_info", "exporter", "--listen", "127.0.0.1:0",
                 "--runtime-dir", str(d), "--interval", str(interval), "--timeout",
                 str(timeout), "--no-libtpu"], stderr=subprocess.PIPE, text=True, env=env,
                cwd=ROOT)
            assert exporter.stderr is not None
            url, said = None, []
            while url is None:
                line = exporter.stderr.readline()
                if not line:
                    raise RuntimeError("the exporter did not start: " + "".join(said))
                said.append(line)
                m = re.search(r"serving (http://\S+/metrics)", line)
                url = m.group(1) if m else None
            fds0, rss0 = _proc(exporter.pid)
            seen, durations, fds, rss = 0, [], [], []
            skipped: dict[str, float] = {}
            for _ in range(args.polls):
                time.sleep(interval)
                text = urllib.request.urlopen(url, timeout=10).read().decode()
                # a process's series carry its program, not its pid
                up = _value(text, r'tpu_info_target_up\{[^}]*program="real_program.py"')
                series = 'program="real_program.py"' in text and "tpu_info_graphs{" in text
                seen += int(bool(up) and up[0] == 1.0 and series)
                durations += _value(text, r"tpu_info_exporter_poll_duration_seconds\{")
                skipped = {m.group(1): float(m.group(2)) for m in re.finditer(
                    r'tpu_info_exporter_targets_skipped\{[^}]*reason="([^"]+)"[^}]*\} (\S+)',
                    text)}
                f, r = _proc(exporter.pid)
                fds.append(f)
                rss.append(r)
            print(f"{n:,} live records at dead ports ({len(hung)} hung, the rest refusing), "
                  f"one real program started after them; exporter --interval {interval:g} "
                  f"--timeout {timeout:g}; load average {os.getloadavg()[0]:.1f}")
            print(f"polls: the real program up with its series in {seen} of {args.polls}; "
                  f"poll seconds {', '.join(f'{x:.2f}' for x in durations)}; exporter fds "
                  f"{fds0} -> {', '.join(map(str, fds))}; RSS {rss0:.0f} -> "
                  f"{', '.join(f'{x:.0f}' for x in rss)} MB")
            print(f"targets skipped (tpu_info_exporter_targets_skipped): {skipped or 'none'}")
            verdict("exporter records, polls with the real program up", seen,
                    f">= {args.polls - 1}", seen >= args.polls - 1)
            worst = max(durations) if durations else float("inf")
            verdict("exporter records, longest poll / --timeout", worst / timeout, "<= 1.0",
                    worst <= timeout)
            verdict("exporter records, fds added", max(fds) - fds0, "<= 128",
                    max(fds) - fds0 <= 128)
    finally:
        if exporter is not None:
            exporter.terminate()
            exporter.wait(20)
        stop_servers(procs)
        for h in hung:
            h.close()
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
