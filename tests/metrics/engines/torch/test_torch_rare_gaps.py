"""Two kinds of periodic work in one torch gap (issue 41: lucidrains'
nGPT validates every 10 steps, one batch under no_grad after
``model.eval()``, and generates 384 tokens every 50 steps after a second
``model.eval()``: the generation, 41 % of the run by A/B, was said as the
validation's, "every 10 steps, 2.2 s each", where a validation took 50 ms).
Real torch on the CPU, the same shape; the program times each part itself:
the generation's line leads its own gaps, at about its own time, and the
validation keeps its own."""

from __future__ import annotations

import textwrap

import pytest

from tests.metrics.engines.torch.test_torch_eager_gaps import _run

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

NGPT = textwrap.dedent('''
    import json, time
    import metrics
    metrics.install(engines=["torch_compile"], serve=False)
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    x, val, prompt = torch.randn(32, 64), torch.randn(32, 64), torch.randn(1, 64)
    spent = {"val": [], "gen": []}
    for i in range(1, 131):
        model.train()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i % 10 == 0 or i == 1:  # (nGPT's step 0 too)
            t = time.perf_counter()
            model.eval()  # LINE val
            with torch.no_grad():
                model(val).pow(2).mean().item()
            spent["val"].append(time.perf_counter() - t)
        if i % 40 == 0 or i == 1:
            t = time.perf_counter()
            model.eval()  # LINE gen
            out = prompt
            for _ in range(400):  # (no no_grad, as nGPT's base_decoding)
                out = torch.tanh(model(out))
            spent["gen"].append(time.perf_counter() - t)
    from tpu_info.wire.fillers import snapshot_to_proto
    print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex(),
                      "spent": spent}))
''')


def test_a_generation_every_40_steps_after_a_validation_every_10_leads_its_own_gaps(tmp_path):
    live, _, lines, spent = _run(tmp_path, NGPT)
    sites = {x.location.rsplit(":", 1)[1]: x for x in live.sites if x.kind == "eval_mode"}
    gen, val = sites[str(lines["gen"])], sites[str(lines["val"])]
    # Main before: the generation's line sat within the validation's gaps,
    # its time all theirs. The first, after step 1, came before the
    # validation's usual time was known: split off once it was.
    assert gen.work == "evaluation" and gen.gaps == 4 and not gen.within, gen
    assert val.work == "evaluation" and val.gaps == 13, val  # (the 14th: after the last step)
    gen_s, val_s = sum(spent["gen"]), sum(spent["val"])
    assert gen.gap_seconds is not None and 0.6 * gen_s < gen.gap_seconds < 1.3 * gen_s, (
        gen.gap_seconds, gen_s)
    assert val.gap_seconds is not None and val.gap_seconds < 3 * val_s + 0.02, (
        val.gap_seconds, val_s)
    from tpu_info.views.findings import find

    found = [f for f in find(live) if f.kind == "periodic_evaluation"]
    assert any(f.location.endswith(f":{lines['gen']}") and f.every_steps
               and 30 <= f.every_steps <= 50 for f in found), [f.message for f in found]
