"""Parameters backward() gives gradients that no optimizer steps (s11: yunjey's
neural_style_transfer optimizes an image through a VGG whose weights still
require grad; requires_grad_(False) saved 50-55 % of its loop by A/B, and
nothing was said). Real torch on the CPU, each program in its own process:
the frozen network is named at the backward() line; a GAN's two optimizers,
an input's gradient read by the program (FGSM's) and a network set
requires_grad_(False) are not."""

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
    import json, sys
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    MODE = sys.argv[1]
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, padding=1))
    head = torch.nn.Conv2d(8, 8, 1)
    if MODE == "frozen":
        net.requires_grad_(False)
        head.requires_grad_(False)
    image = torch.randn(1, 3, 16, 16, requires_grad=True)
    opts = ([torch.optim.Adam([image], lr=0.01)] if MODE in ("image", "frozen") else
            [torch.optim.SGD(net.parameters(), lr=0.01), torch.optim.SGD(head.parameters(), lr=0.01)]
            if MODE == "gan" else
            [torch.optim.SGD([*net.parameters(), *head.parameters()], lr=0.01)])
    for step in range(12):
        x = image if MODE in ("image", "frozen") else torch.randn(1, 3, 16, 16, requires_grad=True)
        loss = head(net(x)).pow(2).mean()
        for o in opts:
            o.zero_grad()
        loss.backward()  # LINE backward
        if MODE == "fgsm":
            x = x + 0.01 * x.grad.sign()  # (the input's gradient, read)
        for o in opts:
            o.step()
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex()}))
''')


def _found(tmp: Path, mode: str) -> list:
    from tpu_info.proto import tpu_info_v1_pb2 as pb
    from tpu_info.views.findings import find
    from tpu_info.wire.codec import snapshot_from_proto

    prog = tmp / "style.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp / "rt"),
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(prog), mode], capture_output=True, text=True,
                       env=env, cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = snapshot_from_proto(pb.Snapshot.FromString(bytes.fromhex(
        json.loads(r.stdout.splitlines()[-1])["proto"])))
    return [f for f in find(s) if f.kind == "unused_gradients"]


def test_a_network_no_optimizer_steps_is_named_at_the_backward_line(tmp_path: Path) -> None:
    line = next(n for n, text in enumerate(PROGRAM.splitlines(), start=1)
                if "# LINE backward" in text)
    (f,) = _found(tmp_path, "image")
    assert f.location.endswith(f"style.py:{line}") and f.severity == "warning", f.message
    assert "for 6 parameters that no optimizer steps" in f.message, f.message
    assert "requires_grad_(False)" in f.message


@pytest.mark.parametrize("mode", ["frozen", "gan", "fgsm"])
def test_parameters_an_optimizer_steps_or_frozen_ones_are_not(tmp_path: Path, mode: str) -> None:
    assert _found(tmp_path, mode) == []
