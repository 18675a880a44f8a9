"""Eight hooked programs of one user started together: none gets gRPC's
"Failed to add port" in its stderr (each probed 8431 free before the first
bound it: 3 to 7 of 8 printed it), and each is served somewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
import json, sys, time
import metrics
metrics.install(engines=[])
print(json.dumps({"port": getattr(metrics, "_exporter", None) and metrics._exporter.port}))
sys.stdout.flush()
time.sleep(1.0)
"""


@pytest.mark.slow
def test_programs_started_together_print_nothing_of_grpcs_own(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TPU_INFO_PORT"}
    env.update(PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    for _, err in outs:
        assert "add_port" not in err and "Failed to add port" not in err, err[-2000:]
    records = list((tmp_path / "rt").glob("*.json"))
    assert not records  # each removed its record at exit
    ports = [json.loads(o.strip().splitlines()[-1])["port"] for o, _ in outs]
    assert all(isinstance(p, int) for p in ports), ports
