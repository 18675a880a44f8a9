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


def test_a_line_read_past_the_users_budget_says_its_figures_are_estimates():
    """Issue 41 item 10: past the first 1,000 reads at the user's lines one in
    64 is recorded and weighted 64; the site says so (``estimated``), its
    finding's cost says "estimated", never "measured", and the flag travels
    over the wire. A line read only within the budget stays exact."""
    import metrics
    from tpu_info.contract.model import SiteReading
    from tpu_info.views.sites import SAMPLED_HOW, site_cost
    from tpu_info.wire.codec import snapshot_from_proto
    from tpu_info.wire.fillers import snapshot_to_proto

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    x = torch.randn(4)
    for _ in range(10):
        x.sum().item()  # MARK exact read
    for _ in range(3000):
        x.mean().item()  # MARK sampled read
    s = metrics.snapshot()
    rec.reset()

    def site(mark: str) -> SiteReading:
        here = f"test_torch_read_budget.py:{line_of(__file__, mark)}"
        return next(x for x in s.sites if x.location.endswith(here))

    exact, sampled = site("# MARK exact read"), site("# MARK sampled read")
    assert exact.count == 10 and not exact.estimated
    assert sampled.estimated and 1500 < sampled.count < 5000, sampled
    assert snapshot_from_proto(snapshot_to_proto(s)).sites == s.sites  # the wire keeps it
    c = site_cost(s, sampled)
    assert c.estimated and SAMPLED_HOW in c.label() and "measured" not in c.label()
    assert site_cost(s, exact).label().startswith("measured")
