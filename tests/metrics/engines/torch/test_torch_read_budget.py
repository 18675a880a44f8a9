"""An optimizer's own reads never spend the user's exact-read budget (issue 41
item 10): AdamW's single-tensor path reads each parameter's ``step_t.item()``
every step; an evaluation's ``loss.item()`` every 20 iterations stays exact."""

from __future__ import annotations

import pytest

from tests.lines import line_of

torch = pytest.importorskip("torch")

STEPS, EVAL_EVERY, EVAL_BATCHES = 100, 20, 40


def test_library_reads_leave_the_users_lines_exact():
    import metrics
    from metrics.engines.torch import syncs as torch_syncs

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(8)])  # 16 tensors
    opt = torch.optim.AdamW(model.parameters(), foreach=False)  # step_t.item() for each
    x = torch.randn(8, 4)
    counted = 0
    for it in range(STEPS):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (it + 1) % EVAL_EVERY == 0:
            with torch.no_grad():
                for _ in range(EVAL_BATCHES):
                    model(x).mean().item()  # MARK eval read
                    counted += 1
    # 16 library reads a step: 1,600 in all, past the 1,000 the user's lines have.
    here = f"test_torch_read_budget.py:{line_of(__file__, '# MARK eval read')}"
    (site,) = [s for s in metrics.snapshot().sites if s.location.endswith(here)]
    assert site.count == counted == 200  # before: sampled after the optimizer's 1,000
    assert site.occurrences == STEPS // EVAL_EVERY
    assert not any("reads at your lines" in b for b in metrics.snapshot().blind_spots)
    assert torch_syncs._hook.exact_left == torch_syncs.EXACT_READS - counted
    rec.reset()
