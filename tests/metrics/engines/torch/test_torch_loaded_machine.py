"""A loaded machine, measured (issue 41: vae's three slow steps on a loaded
machine were scaled 29x and said as "host work no hook sees"). The torch
optimizer-step hook reads, once a second, the share of the loop's time the
training thread waited for a core (``TrainingThreadRunQueue``, Linux
schedstat). Real torch in a process pinned to one core beside a real
spinning process pinned to the same core: the thread waits about half the
time; slow_steps reads that as a loaded machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[4]

PROGRAM = textwrap.dedent('''
    import json, os, subprocess, sys, time
    core = int(sys.argv[1])
    os.sched_setaffinity(0, {core})
    spinner = None
    if sys.argv[2] == "busy":  # another program on the same core
        spinner = subprocess.Popen([sys.executable, "-c", "import os\\n"
                                    f"os.sched_setaffinity(0, {{{core}}})\\nwhile True: pass"])
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), 0.01)
    x = torch.randn(32, 64)
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if spinner is not None:
        spinner.kill()
    d = metrics.snapshot().distribution("TrainingThreadRunQueue")
    print(json.dumps({"count": d.count if d else 0,
                      "median": d.percentile(50.0) if d else None}))
''')


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                    reason="no schedstat here (the run-queue wait is not told)")
def test_a_training_thread_sharing_its_core_reads_as_waiting_for_it(tmp_path: Path) -> None:
    prog = tmp_path / "train.py"
    prog.write_text(PROGRAM)
    core = min(os.sched_getaffinity(0))
    r = subprocess.run([sys.executable, str(prog), str(core), "busy"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                            "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # Two programs on one core: about half the loop waiting for it (the rest
    # of the machine's load only adds to it).
    assert out["count"] >= 3 and out["median"] >= 25.0, out
