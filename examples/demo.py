"""`make demo`: a real JAX training program with the hook, seen from outside.

Starts ``examples/jax_mlp.py`` (its last batch per epoch is one row short, so
it recompiles), waits until it has trained a while, shows ``tpu-info`` (the
device table, graphs, transfers and findings) and ``tpu-info report`` of it
from another process, then stops it with SIGTERM and checks it cleaned up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tpu_info(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpu_info", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def main() -> int:
    with tempfile.TemporaryDirectory() as runtime:
        env = dict(os.environ, TPU_INFO_RUNTIME_DIR=runtime, TPU_INFO_PORT="0",
                   PYTHONPATH=str(ROOT), COLUMNS=os.environ.get("COLUMNS", "120"))
        train = subprocess.Popen(
            [sys.executable, "examples/jax_mlp.py", "--steps", "1000000", "--report", "none"],
            cwd=ROOT, env=env)
        try:
            steps = 0
            deadline = time.monotonic() + 120
            while steps < 120 and time.monotonic() < deadline:
                time.sleep(0.5)
                r = tpu_info("--json", "--no-color", env=env)
                doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
                for t in doc.get("targets", []):
                    steps = max(steps, t.get("steps") or 0)
            print(f"\n$ tpu-info            # the training program has run {steps} steps\n",
                  flush=True)
            print(tpu_info(env=env).stdout, flush=True)
            print("$ tpu-info report --short\n", flush=True)
            print(tpu_info("report", "--short", env=env).stdout, flush=True)
        finally:
            train.send_signal(signal.SIGTERM)
            try:
                code = train.wait(timeout=60)
            except subprocess.TimeoutExpired:
                # Never leave it running; say so and fail.
                train.kill()
                train.wait()
                print("the training program did not stop within 60 s of SIGTERM: killed",
                      file=sys.stderr)
                return 1
        left = list(Path(runtime).glob("*.json"))
        print(f"training program stopped with SIGTERM (exit {code}); "
              f"discovery records left: {len(left)}")
        return 0 if not left else 1


if __name__ == "__main__":
    raise SystemExit(main())
