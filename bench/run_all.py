"""Runs every benchmark under bench/ and prints one table of ratios against
their targets.

    python bench/run_all.py            # full runs (tens of minutes on 2 cores)
    python bench/run_all.py --smoke    # each briefly: checks each runs and prints
    python bench/run_all.py record_cost scrape   # only these

Each benchmark prints lines ``<name>: <value> (target <t>) OK|MISSED``; this
runner collects them. Exit code: 0 when every benchmark ran (a missed target
is reported, not fatal: this machine is shared and noisy), 1 when one failed
to run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["record_cost", "overhead_jax", "hook_pieces", "implicit_transfers", "eager_ops",
         "torch_syncs",
         "overhead_torch",
         "compile_heavy", "scrape", "fanout", "exporter", "exporter_changes",
         "exporter_records", "cli_startup", "lockout",
         "tui_cpu", "stale_records", "profiler_overhead", "load", "attack", "soak", "fork",
         "exit_latency", "helper_restart", "capture_victim", "hostile_server"]
VERDICT = re.compile(r"^(?P<name>[^:\n]+): (?P<value>-?[\d.]+) \(target (?P<target>[^)]*)\) "
                     r"(?P<ok>OK|MISSED)\s*$", re.M)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per benchmark (default 300 smoke, 1800 full)")
    args = ap.parse_args()
    names = args.names or [n for n in ORDER if (HERE / f"{n}.py").exists()]
    timeout = args.timeout or (300 if args.smoke else 1800)
    rows: list[tuple[str, str, str, str, str]] = []
    failed = []
    for name in names:
        cmd = [sys.executable, str(HERE / f"{name}.py")] + (["--smoke"] if args.smoke else [])
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                               cwd=HERE.parent)
            out, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                else (e.stdout or ""), -1
        secs = time.monotonic() - t0
        found = list(VERDICT.finditer(out))
        print(f"== {name} ({secs:.0f} s, exit {rc})", flush=True)
        for line in out.strip().splitlines()[-12:]:
            print(f"   {line}")
        if rc != 0 or not found:
            failed.append(name)
            rows.append((name, "did not run" if rc else "printed no verdict", "", "", "FAILED"))
        for m in found:
            rows.append((name, m["name"].strip(), m["value"], m["target"], m["ok"]))
    print()
    print(f"{'bench':<18} {'measure':<48} {'value':>10}  {'target':<18} result")
    for bench, measure, value, target, ok in rows:
        print(f"{bench:<18} {measure[:48]:<48} {value:>10}  {target:<18} {ok}")
    if failed:
        print(f"failed to run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
