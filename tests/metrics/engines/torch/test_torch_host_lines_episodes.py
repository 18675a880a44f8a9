"""Host work between steps whose steps grow (issue 41: pytorch/examples'
actor_critic steps its optimizer once per episode and its episodes grow from
~10 to ~130 environment steps; the sampled intervals, most of them in the
first and shortest episodes, made select_action() 2 % of a 134 ms step where
it took about half of it). A line's share of each sampled interval, times
the steady step, is what a step spends there. Real torch on the CPU in its
own process; the program times its own select_action() calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.hooked import ROOT

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

PROGRAM = textwrap.dedent('''
    import json, time
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch
    from torch.distributions import Categorical
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    saved, spent = [], [0.0]

    def select_action(state):
        t = time.perf_counter()
        m = Categorical(torch.softmax(model(state), -1))
        action = m.sample()
        saved.append(m.log_prob(action))
        spent[0] += time.perf_counter() - t
        return action.item()

    start = time.perf_counter()
    for episode in range(80):
        for t in range(10 + 2 * episode):  # episodes grow, as a learning agent's do
            select_action(torch.rand(4))  # LINE select
        loss = -torch.stack(saved).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        saved.clear()
    share = spent[0] / (time.perf_counter() - start)
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex(),
                      "share": share}))
''')


def test_a_line_s_share_of_growing_steps_is_its_share_of_each(tmp_path: Path) -> None:
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.views.findings import find
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp_path / "ac.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"),
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(out["proto"])))
    line = next(n for n, text in enumerate(PROGRAM.splitlines(), start=1)
                if "# LINE select" in text)
    (site,) = [x for x in s.sites if x.kind == "host_work" and x.location.endswith(f":{line}")]
    assert site.interval_share is not None and site.interval_share > 0.2, site
    found = [f for f in find(s) if f.kind == "per_step_host_work"
             and f.location == site.location]
    assert found, [f.message for f in find(s)]
    # Within 2x of the program's own timing of its select_action() calls
    # (the profile slows Python a little: up to ~1.3x, docs/findings.md).
    assert out["share"] / 2 <= (found[0].share_of_step or 0.0) <= 2 * out["share"], (
        found[0].message, out["share"])
