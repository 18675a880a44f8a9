"""A graph break at a function Dynamo skips on purpose (``Optimizer.zero_grad``,
``torch.autograd.backward``) has no traceable rewrite: pytorch/tutorials'
torch_compile_full_example compiles a train step holding both, and each
break was a warning, "Rewrite that line so it can be traced", where removing
the zero_grad break saved nothing (0.782 vs 0.793 s a call, CPU A/B)."""

from __future__ import annotations

from tpu_info.contract.model import CounterReading, Event, ProcessRecord, Snapshot
from tpu_info.views.findings import find

ZERO_GRAD = ("Attempted to inline function marked as skipped: Dynamo developers have "
             "intentionally marked that the function `Optimizer.zero_grad` should not be traced")
BACKWARD = ("Attempted to call function marked as skipped: Dynamo developers have intentionally "
            "marked that the function `backward` in file `/v/torch/autograd/__init__.py` should "
            "not be traced")


def _breaks(*details: tuple[str, str]) -> list:
    s = Snapshot(0.0, ProcessRecord(1, "full.py", engine="torch_compile"),
                 counters=(CounterReading("GraphBreaks", len(details)),),
                 events=tuple(Event(i + 1, 1.0, "graph_break", "compile(train)", location=loc,
                                    detail=d) for i, (loc, d) in enumerate(details)))
    return [f for f in find(s) if f.kind == "graph_break"]


def test_a_break_at_a_function_dynamo_skips_on_purpose_is_no_line_to_rewrite():
    found = _breaks(("/w/full.py:102", ZERO_GRAD), ("/w/full.py:105", BACKWARD))
    assert len(found) == 2
    for f, name in zip(sorted(found, key=lambda f: f.location), ("Optimizer.zero_grad",
                                                                    "backward")):
        assert f.severity == "info", f.message  # not measured to cost
        assert "Rewrite that line" not in f.message
        assert f"Dynamo does not trace `{name}` on purpose" in f.message
        assert "outside the compiled function" in f.message


def test_a_break_at_the_users_own_code_is_still_a_line_to_rewrite():
    (f,) = _breaks(("/w/m.py:3", "Unsupported: call_function print in skip_files"))
    assert f.severity == "warning" and "Rewrite that line so it can be traced" in f.message


# pytorch/tutorials' compiled_autograd_tutorial (s11): its own graph_break()
# calls and a compiled lambda calling loss.backward() were warnings too.
USER_BREAK = ("Call to `torch._dynamo.graph_break()`: User-inserted graph break. "
              "Message: None")
TENSOR_BACKWARD = ("Unsupported Tensor.backward() call: Dynamo currently does not support "
                   "tracing `Tensor.backward()` when trace_autograd_ops is off")


def test_a_break_the_user_asked_for_or_at_tensor_backward_is_no_line_to_rewrite():
    found = sorted(_breaks(("/w/t.py:92", USER_BREAK), ("/w/t.py:173", TENSOR_BACKWARD)),
                   key=lambda f: f.location)
    assert [f.severity for f in found] == ["info", "info"], [f.message for f in found]
    assert not any("Rewrite that line" in f.message for f in found)
    assert "the break your code asks for" in found[1].message
    assert "Dynamo does not trace Tensor.backward() on purpose" in found[0].message
