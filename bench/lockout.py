"""Lock-out: the owner's `tpu-info --json` reads while another local user holds every connection.

    python bench/lockout.py [--reads 11] [--gap 4] [--smoke] [--modes thread,process]

For each way of serving (``thread``: in the program; ``process``: the
helper) one hooked program (no engine) is read by its owner, ``tpu-info
--json --timeout 3`` as a fresh process each time: first ``--reads`` times
unattacked, then as many times while a process of uid 65534 (when this runs
as root; else of this user) holds 80 HTTP/2 connections to its TCP port
(the server allows 64) and reopens every one that closes
(``tests.hostile_clients.hold_connections``). Reads are ``--gap`` seconds
apart (11 reads 4 s apart: the 50 s of issue 29).

Prints per mode: reads answered of those made, each phase's median and
slowest read, the attacked/unattacked median ratio side by side, and the
first error. Target: every attacked read answers (1.00), and the ratio
stays under 2.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from _common import ROOT, parser, verdict

from tpu_info.net import probe

PROGRAM = r"""
import json, sys, metrics
metrics.install(engines=[], serve=sys.argv[1], port=0)
print(json.dumps({"port": metrics.exporter().port}), flush=True)
sys.stdin.read()
"""

ATTACKER = r"""
import encodings.idna, json, os, sys
from tests.hostile_clients import hold_connections
if os.geteuid() == 0:
    os.setgid(65534); os.setuid(65534)
print(json.dumps(hold_connections("127.0.0.1", int(sys.argv[1]), 80, float(sys.argv[2]))),
      flush=True)
"""


def _reads(env: dict[str, str], n: int, gap: float) -> tuple[list[float], list[str]]:
    """The seconds of each read that answered, and the errors of the others."""
    took, errors = [], []
    for i in range(n):
        if i:
            time.sleep(gap)
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "tpu_info", "--json", "--timeout", "3"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        seconds = time.monotonic() - started
        try:
            bad = [t["error"] for t in json.loads(r.stdout)["targets"] if not t.get("ok")]
        except (ValueError, KeyError):
            bad = [r.stderr.strip()[-300:] or "no JSON"]
        if r.returncode == 0 and not bad:
            took.append(seconds)
        else:
            errors.append(bad[0] if bad else r.stderr.strip()[-300:])
    return took, errors


def _mode(mode: str, reads: int, gap: float, runtime: str) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=runtime)
    env.pop("TPU_INFO_PORT", None)
    program = subprocess.Popen([sys.executable, "-c", PROGRAM, mode], cwd=ROOT, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    attacker = None
    try:
        assert program.stdout is not None
        port = json.loads(program.stdout.readline())["port"]
        quiet, quiet_errors = _reads(env, reads, gap)
        attack_s = reads * (gap + 3.0) + 30.0
        attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, str(port), str(attack_s)],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while probe.look("127.0.0.1", port, 1.0) is not probe.Verdict.CLOSED_AT_ONCE:
            if time.monotonic() > deadline:
                raise SystemExit("the attack never filled the connection cap")
            time.sleep(0.2)
        attacked, errors = _reads(env, reads, gap)
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait(10)
        if program.stdin is not None:
            program.stdin.close()
        program.wait(30)
    who = "uid 65534" if os.geteuid() == 0 else "this user"
    print(f"[{mode}] unattacked: {len(quiet)}/{reads} answered"
          + (f", median {statistics.median(quiet):.2f} s, slowest {max(quiet):.2f} s"
             if quiet else "") + (f"; first error: {quiet_errors[0]}" if quiet_errors else ""))
    print(f"[{mode}] while {who} holds 80 connections: {len(attacked)}/{reads} answered"
          + (f", median {statistics.median(attacked):.2f} s, slowest {max(attacked):.2f} s"
             if attacked else "") + (f"; first error: {errors[0]}" if errors else ""))
    ratio = (statistics.median(attacked) / statistics.median(quiet)
             if attacked and quiet else float("inf"))
    return len(attacked) / reads, ratio


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--reads", type=int, default=11)
    ap.add_argument("--gap", type=float, default=4.0, help="seconds between reads")
    ap.add_argument("--modes", default="thread,process")
    args = ap.parse_args()
    reads, gap = (2, 0.5) if args.smoke else (args.reads, args.gap)
    modes = ["thread"] if args.smoke else args.modes.split(",")
    ok = True
    for i, mode in enumerate(modes):
        runtime = f"/tmp/tpu-info-lockout-{os.getpid()}-{i}"
        answered, ratio = _mode(mode, reads, gap, runtime)
        ok &= answered == 1.0 and ratio < 2.0
        verdict(f"[{mode}] owner reads answered under the lock-out", answered, "1.00",
                answered == 1.0)
        verdict(f"[{mode}] attacked/unattacked median read time", ratio, "< 2", ratio < 2.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
