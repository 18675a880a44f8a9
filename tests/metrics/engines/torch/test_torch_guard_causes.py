"""Recompile causes when several cached graphs fail, symbolic-shape guards and
``inference_mode``'s dispatch-key guard (issue 41 item 9), on real torch 2.13
(the "eager" backend), checked against Dynamo's own ``recompiles`` log."""

from __future__ import annotations

import logging

import pytest

from tests.lines import line_of
from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.views.causes import classify

torch = pytest.importorskip("torch")


@pytest.fixture
def rec():
    import metrics

    r = metrics.install(engines=["torch_compile"], serve=False)
    metrics.clear_all()
    r.ledger.clear()
    torch._dynamo.reset()
    yield r
    metrics.clear_all()
    r.ledger.clear()


class _Recompiles(logging.Handler):
    """Dynamo's own ``TORCH_LOGS=recompiles`` records: the ground truth."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def dynamo_log():
    torch._logging.set_logs(recompiles=True)
    log = logging.getLogger("torch._dynamo.guards.__recompiles")
    h = _Recompiles()
    log.addHandler(h)
    yield h
    log.removeHandler(h)
    torch._logging.set_logs()


def _causes(rec, name: str):
    return sorted((c for g in rec.ledger.snapshot() if g.name.endswith(name) for c in g.causes
                   if c.kind != CauseKind.FIRST_CALL), key=lambda c: c.time_unix)


class Disc(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.fc(x)


def test_gan_short_last_batch_is_named_though_another_entry_failed_on_requires_grad(
        rec, dynamo_log):
    d = torch.compile(Disc(), backend="eager")
    gen = torch.nn.Linear(8, 16)
    data = torch.randn(16 * 3 + 5, 16)
    for i in range(0, len(data), 16):
        real = data[i:i + 16].clone()
        fake = gen(torch.randn(len(real), 8))
        d(real)  # MARK real
        d(fake.detach())
        d(fake)  # MARK fake
    causes = _causes(rec, "compile(Disc.forward)")
    # Dynamo's ground truth: 3 recompiles (requires_grad, then the short batch twice).
    assert sum("Recompiling function forward" in m for m in dynamo_log.messages) == 3
    assert len(causes) == 3
    rg, short_real, short_fake = causes
    assert rg.kind == CauseKind.REQUIRES_GRAD
    assert rg.location.endswith(f":{line_of(__file__, '# MARK fake')}")
    # Main before: the first entry's requires_grad failure named the short batch
    # (0/2 fails requires_grad, 0/1 and 0/0 fail on size: the size is what is new).
    assert short_real.kind == CauseKind.BATCH_SIZE and short_real.after.startswith("f32[5,")
    assert short_fake.kind == CauseKind.BATCH_SIZE
    assert short_real.location.endswith(f":{line_of(__file__, '# MARK real')}")
    # A training loader's short batch is short, whichever line saw it first.
    first = f"{__file__}:{line_of(__file__, '# MARK real')}"
    assert classify(short_fake, first, "torch_compile").kind == "short last batch"


def test_symbolic_batch_guard_is_a_batch_size_beyond_the_compiled_range(rec, dynamo_log):
    @torch.compile(backend="eager")
    def step(x):
        if x.size(0) >= 16:
            return x * 2
        return x + 1

    for n in (32, 24, 8):  # 24 makes the batch dynamic, 8 fails `16 <= x.size()[0]`
        step(torch.ones(n, 4))
    assert any("16 <= x.size()[0]" in m for m in dynamo_log.messages)
    c = _causes(rec, ".step)")[-1]
    assert (c.kind, c.dim, c.before, c.after) == (CauseKind.SYMBOLIC_SHAPE, 0, "16", "8")
    k = classify(c, None, "torch_compile")
    assert k.kind == "batch size outside the compiled range (symbolic shape)"
    assert "drop_last" in k.advice


def test_growing_generation_length_is_sequence_growth(rec, dynamo_log):
    @torch.compile(backend="eager", dynamic=True)
    def decode(idx):
        if idx.size(1) != 64:
            return idx + 1
        return idx

    for t in (62, 63, 64):
        decode(torch.ones(2, t))
    assert any("idx.size()[1] != 64" in m for m in dynamo_log.messages)
    c = _causes(rec, ".decode)")[-1]
    assert (c.kind, c.dim, c.before, c.after) == (CauseKind.SYMBOLIC_SHAPE, 1, "64", "64")
    k = classify(c, None, "torch_compile")
    assert k.kind == "sequence length growth (symbolic shape)"
    assert "mark_dynamic" in k.advice


def test_inference_mode_tensor_is_typed_not_other(rec, dynamo_log):
    m = torch.nn.Linear(4, 4)

    @torch.compile(backend="eager")
    def predict(x):
        return m(x)

    with torch.no_grad():
        predict(torch.ones(3, 4))
        with torch.inference_mode():
            x = torch.ones(3, 4)
        predict(x)  # an inference tensor outside inference_mode: the dispatch-key guard
    assert any("dispatch key set mismatch" in m for m in dynamo_log.messages)
    c = _causes(rec, ".predict)")[-1]
    assert c.kind == CauseKind.INFERENCE_MODE and c.after == "inference tensor"
    k = classify(c, None, "torch_compile")
    assert k.kind == "inference mode" and "torch.no_grad()" in k.advice


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 8)
        self.out = torch.nn.Linear(8, 32)

    def forward(self, idx):
        return self.out(self.emb(idx))


def _train_evaluate_generate(**compile_kw):
    """LLMs-from-scratch's 01_opt_single_gpu.py in small: training batches of 8
    (the loader drops its last), an evaluation under no_grad at the training
    line, then a batch-1 generation under no_grad at a line of its own."""
    model = torch.compile(Tiny(), backend="eager", **compile_kw)
    opt = torch.optim.SGD(model.parameters(), 0.1)

    def loss_of(x):
        return model(x).pow(2).mean()  # MARK train

    data = torch.randint(0, 32, (64, 16))
    for i in range(0, 64, 8):
        loss_of(data[i:i + 8]).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        loss_of(data[:8])
    idx = data[:1, :4]
    for _ in range(3):
        with torch.no_grad():
            logits = model(idx)  # MARK generate
        idx = torch.cat((idx, logits[:, -1:].argmax(-1)), dim=1)


def test_a_batch_of_one_at_a_generation_line_is_a_second_batch_size(rec, dynamo_log):
    _train_evaluate_generate()
    assert any("size mismatch at index 0. expected 8, actual 1" in m
               for m in dynamo_log.messages)
    (batch,) = [c for c in _causes(rec, "compile(Tiny.forward)")
                if c.kind == CauseKind.BATCH_SIZE]
    assert batch.location.endswith(f":{line_of(__file__, '# MARK generate')}")
    # Main before: "short last batch", drop_last=True (the loader had it).
    first = f"{__file__}:{line_of(__file__, '# MARK train')}"
    k = classify(batch, first, "torch_compile")
    assert k.kind == "second batch size, e.g. evaluation vs training" and k.expected, k
    assert "drop_last" not in k.advice
    # At the function's first line a smaller batch is still the short last one.
    at_first = classify(batch, batch.location, "torch_compile")
    assert at_first.kind == "short last batch"


def test_a_dynamic_batch_of_one_at_another_line_is_a_second_batch_size():
    from tpu_info.contract.model import RecompileCause

    c = RecompileCause(0.0, "2 <= idx.size()[0]", "gen.py:9", kind=CauseKind.SYMBOLIC_SHAPE,
                       guard="symbolic", argument="idx", dim=0, name="size", before="2",
                       after="1")
    assert classify(c, "train.py:5", "torch_compile").kind == \
        "second batch size, e.g. evaluation vs training"
    assert classify(c, "gen.py:9", "torch_compile").kind == \
        "batch size outside the compiled range (symbolic shape)"


@pytest.mark.parametrize("dynamic, after", [(None, r"i64\[1,s\d+\]"), (False, r"i64\[1,4\]")])
def test_a_size_guards_new_shape_is_the_recompiled_graphs_own(rec, dynamic, after):
    import re

    _train_evaluate_generate(**({} if dynamic is None else {"dynamic": dynamic}))
    ((gen, batch),) = [(g, c) for g in rec.ledger.snapshot() for c in g.causes
                       if c.kind == CauseKind.BATCH_SIZE]
    # Main before: the old type with its batch swapped, i64[1,16] for an input
    # of [1,4]; now the generation's graph's own (its sequence dynamic or not).
    assert batch.before == "i64[8,16]"
    assert re.fullmatch(after, batch.after or ""), batch.after
    assert gen.signature == (f"idx: {batch.after}",)
