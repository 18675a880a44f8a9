"""Advice that fits how the program is written (issue 28, item 9): a short last
batch is told about ``drop_last`` only where torch's DataLoader can be in play;
a static argument that is a function compiles once per function (expected);
``compile_share`` names the findings that hold its recompiles, or what the
compiles were when no finding does."""

from __future__ import annotations

from dataclasses import replace

from tpu_info.contract import catalog
from tpu_info.contract.model import (
    DistributionReading,
    GraphRecord,
    ProcessRecord,
    RecompileCause,
    Severity,
    Snapshot,
    Unit,
)
from tpu_info.views.causes import classify, is_function, torch_loaded
from tpu_info.views.findings import compile_share, find, recompiles

_SHORT = RecompileCause(2.0, "argument 'batch' changed f32[32,128] -> f32[17,128]",
                        "/src/train.py:40", "batch", "f32[32,128]", "f32[17,128]")
_SLICE = "range(0, n - batch + 1, batch)"


def _snap(cause: RecompileCause, engines: str = "jax", graph_engine: str = "jax",
          name: str = "jit(step)") -> Snapshot:
    first = RecompileCause(0.5, "first call", "/src/train.py:40")
    return Snapshot(
        taken_at_unix=10.0, uptime_seconds=10.0,
        process=ProcessRecord(pid=1, name="train.py", engine=engines),
        graphs=(GraphRecord("a" * 64, name, graph_engine, 1.0, 1.0, compiles=1,
                            compile_seconds_total=0.5, compile_seconds_last=0.5,
                            causes=(first,)),
                GraphRecord("b" * 64, name, graph_engine, 2.0, 2.0, compiles=1,
                            compile_seconds_total=0.4, compile_seconds_last=0.4,
                            causes=(cause,))))


def test_torch_loaded_reads_the_processes_engines():
    assert torch_loaded("jax,torch_compile") and torch_loaded("torch_xla")
    assert not torch_loaded("jax") and not torch_loaded("")


def test_short_last_slice_in_a_jax_program_is_not_told_drop_last():
    (f,) = recompiles(_snap(_SHORT))
    assert f.kind == "recompile_short_last_batch"
    assert "drop_last" not in f.message and _SLICE in f.message, f.message
    # (a tf.data or grain pipeline's own switch: haiku's vae example)
    assert "drop_remainder=True" in f.message, f.message


def test_short_last_batch_where_torch_is_loaded_names_drop_last_and_slicing():
    # A JAX program that imported torch (for torch.utils.data's DataLoader).
    (f,) = recompiles(_snap(_SHORT, engines="jax,torch_compile"))
    assert "drop_last=True on torch's DataLoader" in f.message and _SLICE in f.message


def test_torch_compile_short_last_batch_names_drop_last():
    cause = RecompileCause(2.0, "tensor 'x' size mismatch at index 0. expected 32, actual 17",
                           "/src/train.py:40", "x")
    (f,) = recompiles(_snap(cause, "torch_compile", "torch_compile", "forward"))
    assert "(short last batch)" in f.message and "drop_last=True" in f.message
    # Without a process record the cause, torch's own, still says torch.
    assert "drop_last=True" in classify(cause).advice


def _static(before: str, after: str) -> RecompileCause:
    return RecompileCause(2.0, f"static argument 'act' changed {before} -> {after}",
                          "/src/model.py:12", "act", before, after)


# Values as JAX 0.10's explanation gives them (measured), cut at 60 characters
# by the hook as it records them.
_RELU = "<jax._src.custom_derivatives.custom_jvp object at 0x7fbe8..."
_TANH = "<PjitFunction of <function tanh at 0x7fbe89542f20>>"
_GELU = "<function gelu at 0x7fbe892f1260>"
_PARTIAL = "functools.partial(<PjitFunction of <function leaky_relu a..."


def test_static_argument_that_is_a_function_is_expected_with_no_array_advice():
    for before, after in ((_RELU, _TANH), (_TANH, _GELU), (_TANH, _PARTIAL)):
        (f,) = recompiles(_snap(_static(before, after)))
        assert f.kind == "recompile_static_argument_function", f.message
        assert f.severity == Severity.INFO
        assert "pass it as an array" not in f.message
        assert "once per distinct function passed" in f.message
        assert "expected unless it changes every call" in f.message


def test_a_new_object_of_the_same_function_each_call_is_a_warning():
    before, after = ("<function <lambda> at 0x7f4047628cc0>",
                     "<function <lambda> at 0x7f4047628fe0>")
    s = _snap(_static(before, after))
    again = replace(s.graphs[1], hash="c" * 64, causes=(replace(
        _static(after, "<function <lambda> at 0x7f4047629100>"), time_unix=3.0),))
    (f,) = recompiles(replace(s, graphs=(*s.graphs, again)))  # made anew, twice
    assert f.kind == "recompile_function_re_created" and f.severity == Severity.WARNING
    assert "outside the loop" in f.message and "pass it as an array" not in f.message
    # Once is no re-creation: two lambdas, each made once, read the same (issue 41 item 12).
    (f,) = recompiles(s)
    assert f.kind == "recompile_static_argument_function" and f.severity == Severity.INFO


def test_a_static_number_keeps_the_array_advice():
    (f,) = recompiles(_snap(_static("2", "3")))
    assert f.kind == "recompile_static_argument" and f.severity == Severity.WARNING
    assert "pass it as an array" in f.message


def test_is_function():
    assert all(is_function(v) for v in (_RELU, _TANH, _GELU, _PARTIAL,
                                         "<bound method Net.act of <Net object at 0x1>>",
                                         "<built-in function abs>"))
    assert not any(is_function(v) for v in ("2", "'relu'", "None", "f32[3]", "", None,
                                            "<Config object at 0x7f00>"))


def _compile_time(n: int, seconds: float) -> DistributionReading:
    return DistributionReading(catalog.COMPILE_TIME, Unit.TIME_NS, n, seconds * 1e9,
                               seconds * 1e9 / n, seconds * 1e9 / n)


def _share(graphs: tuple[GraphRecord, ...], n: int = 4, engines: str = "jax") -> Snapshot:
    return Snapshot(taken_at_unix=10.0, uptime_seconds=10.0,
                    process=ProcessRecord(pid=1, name="train.py", engine=engines),
                    distributions=(_compile_time(n, 6.0),), graphs=graphs)


def _graph(h: str, name: str, causes: tuple[RecompileCause, ...] = (),
           engine: str = "jax") -> GraphRecord:
    return GraphRecord(h * 64, name, engine, 1.0, 1.0, compiles=1, compile_seconds_total=1.5,
                       compile_seconds_last=1.5, causes=causes)


def test_compile_share_with_no_recompile_finding_says_what_the_compiles_were():
    # Set-up code ran jax.random.normal at two shapes: two graphs of one name,
    # no cause, too few to be a recompile finding.
    s = _share((_graph("a", "jit(_normal)"), _graph("b", "jit(_normal)"),
                _graph("c", "jit(train_step)"), _graph("d", "jit(eval_step)")))
    assert list(recompiles(s)) == []
    (f,) = compile_share(s)
    assert "above" not in f.message and "check the recompiles" not in f.message
    assert "jit(_normal) 3.0 s in 2 graphs, jit(eval_step) 1.5 s" in f.message, f.message
    assert "the persistent compilation cache would load them next run" in f.message


def test_compile_share_names_the_findings_that_hold_its_recompiles():
    first = RecompileCause(0.5, "first call", "/src/train.py:40")
    s = _share((_graph("a", "jit(step)", (first,)), _graph("b", "jit(step)", (_SHORT,)),
                _graph("c", "jit(other)")), n=3)
    (f,) = compile_share(s)
    assert "jit(step) 3.0 s in 2 compiles (see recompile_short_last_batch" in f.message, f.message
    assert {x.kind for x in find(s)} >= {"recompile_short_last_batch", "compile_share"}


def test_compile_share_names_an_info_only_recompile_finding():
    # torch_xla's warm-up: a recompile finding of its own, info only.
    warm = RecompileCause(2.0, "new graph at sync 1, 0 syncs after the last new graph at this "
                          "line (graph inputs 7 -> 12)", "train.py:65")
    first = RecompileCause(0.5, "first call", "train.py:65")
    s = _share((_graph("a", "xla(train.py:65)", (first,), "torch_xla"),
                _graph("b", "xla(train.py:65)", (warm,), "torch_xla"),
                _graph("c", "xla(train.py:80)", (), "torch_xla")), n=3, engines="torch_xla")
    (f,) = compile_share(s)
    assert "(see warm_up" in f.message, f.message
