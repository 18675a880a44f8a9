"""torch.compile's backward is compiled lazily, at the first ``backward()``,
outside Dynamo's compile: nanoGPT's iteration 0 spent 37 s there that the hook
did not count (16 s said of 53 s). Real torch on the CPU with AOTAutograd
(the "aot_eager" backend)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.slow
def test_the_lazy_backward_compile_counts_in_its_graphs_compile_time():
    import metrics
    from tpu_info.contract import catalog
    from tpu_info.contract.model import EventKind

    rec = metrics.install(engines=["torch_compile"], serve=False)
    rec.reset()
    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()
    try:
        torch.manual_seed(0)
        model = torch.compile(torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)),
            backend="aot_eager")
        x = torch.randn(16, 32)
        for _ in range(3):
            model(x).square().mean().backward()
        snap = metrics.snapshot()
        # torch's own record of that compile (AOTAutograd's, is_forward=False)
        (bw,) = [m for m in torch._dynamo.utils.get_compilation_metrics()
                 if m.is_forward is False and not m.is_runtime]
    finally:
        rec.reset()
    (graph,) = [g for g in snap.graphs if g.engine == "torch_compile"]
    (compiled,) = [e for e in snap.events if e.kind == EventKind.COMPILE.value]
    assert graph.compiles == 1 and snap.counter(catalog.UNCACHED_COMPILE) == 1
    # Two backend compiles timed: the forward (with Dynamo's trace) and the backward.
    assert snap.distribution(catalog.COMPILE_TIME).count == 2
    added = graph.compile_seconds_total - compiled.value  # the event: the forward's time
    assert added == pytest.approx(bw.duration_us / 1e6) and added > 0
    assert graph.compile_seconds_total == pytest.approx(graph.compile_seconds_last)
