"""CLI start-up: `tpu-info` one-shot against one live hooked process, against
Google's `tpu-info` (PyPI 0.14.2, in its own target directory; on a machine
without TPUs it prints "No TPU chips found."), alternating, same run.

    python bench/cli_startup.py [--smoke]

Prints the median wall time of each, the ratio (target <= 0.15, issue 32),
the median of `tpu-info --version`, the load average, and an import-time
breakdown of our one-shot path.

Both run as installed, under the same interpreter flags. Google's package
was compiled by pip; ours is run once before timing with bytecode written
to a private cache (a checkout with PYTHONDONTWRITEBYTECODE=1 would compile
every source file edited since its last .pyc on every run: 20-40 ms that no
installed tpu-info pays). Both run without ``site`` (``-S``, as Google's
always has: it keeps this venv's tpu_info off Google's path), each finding
its packages on PYTHONPATH; ours with site (this checkout's venv runs the
editable install's .pth finder) is printed beside it, not in the ratio.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from _common import ROOT, parser, verdict

VERSION = "0.14.2"


def google_dir() -> Path:
    root = os.environ.get("TPU_INFO_TEST_CACHE") or str(Path.home() / ".cache/tpu-info-tests")
    target = Path(root) / "google-tpu-info"
    if not (target / f"tpu_info-{VERSION}.dist-info").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", f"tpu-info=={VERSION}",
                        "--target", str(target)], check=True, timeout=600)
    return target


CPU: dict[str, list[float]] = {}  # command -> CPU seconds (user + system) of each run


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], env: dict[str, str],
          cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    t0, c0 = time.perf_counter(), _children_cpu()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    CPU.setdefault(" ".join(cmd), []).append(_children_cpu() - c0)
    return time.perf_counter() - t0, r


def main() -> int:
    args = parser(__doc__).parse_args()
    rounds = 3 if args.smoke else 15
    sys.path.insert(0, str(ROOT))
    from tests.hooked import HookedProgram

    gdir = google_dir()
    with tempfile.TemporaryDirectory() as rt, tempfile.TemporaryDirectory() as pyc:
        deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        env = dict(os.environ, TPU_INFO_RUNTIME_DIR=rt, TPU_INFO_PORT="0",
                   PYTHONPATH=os.pathsep.join([str(ROOT), *deps]), PYTHONPYCACHEPREFIX=pyc)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        genv = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        genv["PYTHONPATH"] = str(gdir)
        ours_cmd = [sys.executable, "-S", "-m", "tpu_info"]
        site_cmd = [sys.executable, "-m", "tpu_info"]
        google_cmd = [sys.executable, "-S", "-c",
                      "import sys; from tpu_info import cli; sys.exit(cli.print_chip_info())"]
        with HookedProgram(env={"TPU_INFO_RUNTIME_DIR": rt, "TPU_INFO_PORT": "0"}):
            for cmd in (ours_cmd, site_cmd, [*ours_cmd, "--version"]):  # writes bytecode
                timed(cmd, env, str(ROOT))
            CPU.clear()
            load = [os.getloadavg()[0]]
            ours, google, version, with_site = [], [], [], []
            for i in range(rounds):
                pair = [("ours", ours_cmd, env, str(ROOT), ours),
                        ("google", google_cmd, genv, rt, google),
                        ("ours with site", site_cmd, env, str(ROOT), with_site)]
                for _, cmd, e, cwd, out in (pair if i % 2 == 0 else pair[::-1]):
                    dt, r = timed(cmd, e, cwd)
                    out.append(dt)
                if i == 0:
                    _, r = timed(ours_cmd, env, str(ROOT))
                    assert "jit(f)" in r.stdout, r.stdout + r.stderr
                dt, _ = timed([*ours_cmd, "--version"], env, str(ROOT))
                version.append(dt)
            load.append(os.getloadavg()[0])
            _, rg = timed(google_cmd, genv, rt)
            print(f"google tpu-info says: {rg.stdout.strip()[:80]!r}")
            imp = subprocess.run([*ours_cmd[:2], "-X", "importtime", "-m", "tpu_info"],
                                 capture_output=True, text=True, env=env, cwd=str(ROOT))
    o, g, v = statistics.median(ours), statistics.median(google), statistics.median(version)
    print(f"tpu-info one-shot (1 hooked process): median {o * 1e3:.0f} ms over {rounds} runs")
    print(f"google tpu-info {VERSION}:             median {g * 1e3:.0f} ms")
    s = statistics.median(with_site)
    print(f"tpu-info one-shot with site:          median {s * 1e3:.0f} ms (ratio {s / g:.3f}; "
          "not the verdict: the venv's .pth files)")
    print(f"tpu-info --version:                   median {v * 1e3:.0f} ms")
    print(f"load average (1 min) {load[0]:.2f} -> {load[1]:.2f} on {os.cpu_count()} CPUs")
    oc, gc = (statistics.median(CPU[" ".join(c)]) for c in (ours_cmd, google_cmd))
    print(f"CPU (user + system) median: ours {oc * 1e3:.0f} ms, google {gc * 1e3:.0f} ms, "
          f"ratio {oc / gc:.3f} (steadier than wall time on a loaded machine; not the verdict)")
    rows = []
    for line in imp.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    top = [r for r in rows if not r[1].startswith("   ")]  # top-level imports
    print("import time (cumulative us), top-level modules of the one-shot path:")
    for us, name in sorted(top, reverse=True)[:10]:
        print(f"  {us:>8}  {name.strip()}")
    verdict("cli_startup ratio ours/google", o / g, "<= 0.15", o / g <= 0.15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
