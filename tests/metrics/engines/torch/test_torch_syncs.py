"""Reads of tensor values (``.item()``, ``.tolist()``, ``.cpu()``) under
torch.compile, and steps inferred from training calls only: one real
training loop (the "eager" backend) in the shape of nanoGPT's and a VAE's,
with evaluation every few steps, shared by the tests."""

from __future__ import annotations

import pytest

from tests.conftest import run_python
from tests.lines import line_of

torch = pytest.importorskip("torch")

STEPS, EVAL_EVERY, EVAL_BATCHES = 30, 10, 3


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 1024)  # a wide output: its tolist() costs ms

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _line_of(text: str) -> int:
    return line_of(__file__, text)


def _train() -> float:
    torch.manual_seed(0)
    model = torch.compile(Net(), backend="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(128, 32), torch.randn(128, 1024)
    train_loss = 0.0
    for it in range(STEPS):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()  # the optimizer's own reads of its CPU step counters
        train_loss += loss.item()  # VAE: accumulate on the host
        lossf = loss.item()  # nanoGPT: log every iteration
        rows = out.detach().tolist()  # a large read every step
        _ = x.cpu()  # a CPU tensor: nothing moves
        if (it + 1) % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                for _ in range(EVAL_BATCHES):
                    model(x)
            model.train()
    assert len(rows) == 128
    return train_loss + lossf


@pytest.fixture(scope="module")
def run():
    import metrics
    from tpu_info.views import findings

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch._dynamo.reset()
    _train()
    snap = metrics.snapshot()
    yield snap, list(findings.find(snap))
    rec.reset()


def _sync_sites(snap):
    return {int(s.location.rsplit(":", 1)[1]): s for s in snap.sites
            if s.kind == "sync" and s.location.startswith(__file__)}


def test_item_and_tolist_reads_are_sync_sites_at_their_lines(run):
    snap, _ = run
    sites = _sync_sites(snap)
    vae, gpt = _line_of("# VAE: accumulate"), _line_of("# nanoGPT: log")
    big = _line_of("# a large read every step")
    assert set(sites) == {vae, gpt, big}, snap.sites  # not opt.step(), not x.cpu()
    assert [sites[n].count for n in (vae, gpt, big)] == [STEPS] * 3
    assert sites[vae].detail == "item()" and sites[big].detail == "tolist()"
    assert sites[gpt].function == "_train" and sites[gpt].seconds > 0
    assert sites[big].bytes == STEPS * 128 * 1024 * 4
    assert 0 < sites[vae].first_seen_unix <= sites[vae].last_seen_unix


def test_a_costly_read_every_step_is_a_per_step_sync_finding(run):
    _, found = run
    line = _line_of("# a large read every step")
    (f,) = [f for f in found if f.kind == "per_step_sync"
            and f.location.endswith(f"test_torch_syncs.py:{line}")]
    assert f.per_step == pytest.approx(1.0) and "measured" in f.message
    assert "tolist()" in f.message


def test_evaluation_calls_are_not_steps(run):
    snap, _ = run
    steps = snap.steps
    assert steps.source == "inferred" and steps.count == STEPS  # 39 before: evaluation counted
    evals = STEPS // EVAL_EVERY * EVAL_BATCHES
    assert steps.excluded_calls == evals
    assert steps.basis.startswith(f"optimizer.step(): {STEPS} calls (AdamW)")  # the step
    assert f"the compiled model (compile(Net.forward)) ran {STEPS} times" in steps.basis
    assert f"its {evals} calls with gradients off (evaluation) are not steps" in steps.basis


def test_reads_it_cannot_count_are_blind_spots(run):
    snap, _ = run
    assert any("float(t), int(t) and bool(t)" in b for b in snap.blind_spots)



def test_a_read_in_a_compiled_function_is_dynamos_break_and_a_site():
    """The read wrappers are Python: Dynamo's frame hook must not compile
    them (or the hook behind them) when the eager part of a compiled
    function reads a value."""
    import metrics

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch._dynamo.reset()

    @torch.compile(backend="eager")
    def f(x):
        y = x.sin()
        if y.sum().item() > 0:  # a read inside the compiled function
            y = y * 2
        return y

    for _ in range(3):
        f(torch.ones(4))
    line = _line_of("# a read inside the compiled function")
    names = {g.name.replace(f"{f.__qualname__[:-1]}", "") for g in rec.ledger.snapshot()}
    assert names == {"compile(f)", f"compile(f@{line})"}, names  # no hook frame compiled
    (site,) = [s for s in metrics.snapshot().sites if s.kind == "sync"
               and s.location.endswith(f"test_torch_syncs.py:{line}")]
    assert site.count == 3
    rec.reset()

def test_reads_after_the_first_thousand_are_sampled_estimates():
    import metrics
    from metrics.engines.torch import syncs as torch_syncs

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    hook = torch_syncs._hook
    hook.exact_left = torch_syncs.EXACT_READS
    hook._rng.seed(3)
    t = torch.tensor(2.0)
    for _ in range(5000):
        t.item()  # read in a tight loop
    (site,) = [s for s in metrics.snapshot().sites
               if s.location.endswith(f"test_torch_syncs.py:{_line_of('# read in a tight')}")]
    assert abs(site.count - 5000) < 800 and site.count % torch_syncs.MEAN_GAP != 0
    assert any("are estimates" in b for b in metrics.snapshot().blind_spots)
    rec.reset()


@pytest.mark.slow
def test_uninstall_gives_torch_its_own_methods_back():
    r = run_python(
        "import torch, metrics\n"
        "base = torch._C.TensorBase\n"
        "assert torch.Tensor.item is base.item\n"
        "metrics.install(engines=['torch_compile'], serve=False)\n"
        "assert torch.Tensor.item.__wrapped__ is base.item and torch.tensor(2.0).item() == 2.0\n"
        "assert torch.ones(2).tolist() == [1.0, 1.0] and torch.ones(2).cpu(memory_format="
        "torch.preserve_format).shape == (2,)\n"
        "metrics.uninstall()\n"
        "assert all(getattr(torch.Tensor, n) is getattr(base, n) for n in ('item', 'tolist', "
        "'cpu')), 'not restored'\n"
        "print('ok')\n")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.slow
def test_lazy_tensor_reads_are_sync_sites_and_cpu_reads_then_are_not():
    """Under torch._lazy each .item() runs the pending graph and waits: a
    device read. With device reads seen, a CPU tensor's reads are not syncs."""
    r = run_python(
        "import torch, torch._lazy, torch._lazy.ts_backend, metrics\n"
        "torch._lazy.ts_backend.init()\n"
        "metrics.install(engines=['torch_lazy'], serve=False)\n"
        "x, w = torch.ones(5, 7, device='lazy'), torch.ones(7, 2, device='lazy')\n"
        "c = torch.tensor(1.0)\n"
        "for _ in range(6):\n"
        "    y = (x @ w).tanh().sum()\n"
        "    torch._lazy.mark_step()\n"
        "    y.item()\n"
        "    c.item()\n"
        "sites = [s for s in metrics.snapshot().sites if s.kind == 'sync']\n"
        "print([(s.location.rsplit(':', 1)[1], s.count, s.detail) for s in sites])\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[('9', 6, 'item()')]", r.stdout
