"""A read every step whose use the hook does not record gets advice for each
use (issue 41): pytorch/examples' regression reads ``loss = output.item()``
as its loop's stop test and ``b_target.item()`` (a constant) in its target
function every step, and both were told to "log every N steps". Real torch
on the CPU, the program's shape unchanged but for a step limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpu_info.views.findings import find

ROOT = Path(__file__).resolve().parents[3]

REGRESSION = textwrap.dedent('''
    import json
    from itertools import count
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    POLY_DEGREE = 4
    W_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5


    def make_features(x):
        x = x.unsqueeze(1)
        return torch.cat([x ** i for i in range(1, POLY_DEGREE+1)], 1)


    def f(x):
        return x.mm(W_target) + b_target.item()  # LINE constant


    def get_batch(batch_size=32):
        random = torch.randn(batch_size)
        x = make_features(random)
        y = f(x)
        return x, y


    fc = torch.nn.Linear(W_target.size(0), 1)
    for batch_idx in count(1):
        batch_x, batch_y = get_batch()
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()  # LINE stop
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        if loss < 1e-3 or batch_idx == 300:
            break
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex()}))
''')


@pytest.mark.slow
def test_a_stop_test_and_a_constant_read_every_step_are_not_told_only_to_log(tmp_path):
    pytest.importorskip("torch")
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp_path / "main.py"
    prog.write_text(REGRESSION)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               TPU_INFO_RUNTIME_DIR=str(tmp_path / "rt"))
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(
        json.loads(r.stdout.splitlines()[-1])["proto"])))
    lines = {text.rsplit("# LINE ", 1)[1]: n
             for n, text in enumerate(REGRESSION.splitlines(), start=1) if "# LINE " in text}
    reads = {f.location.rsplit(":", 1)[1]: f for f in find(s) if f.kind == "per_step_sync"}
    assert set(reads) == {str(lines["stop"]), str(lines["constant"])}, reads
    for f in reads.values():
        # Main before: "Log every N steps, or keep the value on the device ...".
        assert "test every N steps if it decides when to stop" in f.message, f.message
        assert "read it once before the loop if it never changes" in f.message
        assert "Log every N steps if it is logged" in f.message
