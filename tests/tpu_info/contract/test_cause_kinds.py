"""Typed recompile causes: the hooks name the kind, the views advise by kind.

The views read a cause's kind and fields, never its words: a typed cause
with any description gets its kind's advice. Words are parsed back only for
causes from older hooks (kind unknown), and read the same as the typed ones.
"""

from __future__ import annotations

import pytest

from tpu_info.contract.cause_kinds import (
    CauseKind,
    kind_of,
    static_kind,
    type_change,
    xla_warm_up,
)
from tpu_info.contract.model import RecompileCause
from tpu_info.views.causes import ADVICE, classify, typed, warm_up
from tpu_info.wire import codec

K = CauseKind


@pytest.mark.parametrize("before,after,want", [
    ("f32[8,3]", "f32[5,3]", (K.BATCH_SIZE, 0)),
    ("f32[8@d,3]", "f32[5@d,3]", (K.BATCH_SIZE, 0)),
    ("f32[8,3]", "f32[8,4]", (K.SHAPE_DIM, 1)),
    ("f32[8,3]", "f32[8,3,1]", (K.RANK, None)),
    ("f32[8,3]", "i32[8,3]", (K.DTYPE, None)),
    ("f32[] (weak)", "f32[]", (K.WEAK_TYPE, None)),
    ("f32[8]({Explicit: ('d',)})", "f32[8]", (K.SHARDING, None)),
    ("f32[8]", "f32[8]", None),
    ("dict('a')", "dict('b')", None),
])
def test_type_change_names_the_aspect_and_the_dimension(before, after, want):
    assert type_change(before, after) == want


def test_static_values_functions_and_functions_made_anew():
    assert static_kind("2", "3") == K.STATIC_VALUE
    assert static_kind("<function relu at 0x1>", "<function gelu at 0x2>") == K.STATIC_FUNCTION
    assert static_kind("<function <lambda> at 0x1>", "<function <lambda> at 0x2>") == \
        K.FUNCTION_RECREATED
    assert static_kind("<jax._src.custom_derivatives.custom_jvp object at 0x1>",
                       "<jax._src.custom_derivatives.custom_jvp object at 0x2>") == \
        K.FUNCTION_RECREATED
    assert static_kind("<function f at 0x1>", "<function f at 0x2...") == K.STATIC_FUNCTION


def test_the_views_read_the_kind_not_the_words():
    """Any words at all: the kind and its fields decide the advice."""
    for kind, label in [(K.DTYPE, "dtype"), (K.WEAK_TYPE, "weak type"),
                        (K.FUNCTION_RECREATED, "function re-created"),
                        (K.PYTREE, "pytree structure"), (K.DEVICE, "sharding/device")]:
        k = classify(RecompileCause(0.0, "something changed", kind=kind))
        assert (k.kind, k.words) == (label, "something changed")
    c = RecompileCause(0.0, "words", "t.py:9", before="f32[32]", after="f32[7]",
                       kind=K.BATCH_SIZE, dim=0)
    assert classify(c).kind == "short last batch"
    assert classify(c, first_site="other.py:1").kind.startswith("second batch size")
    assert "drop_last=True" in classify(c, None, "jax,torch_compile").advice
    assert "drop_last" not in classify(c, None, "jax").advice
    config = RecompileCause(0.0, "words", kind=K.CONFIG, name="jax_enable_x64")
    assert classify(config).kind == "config" and "jax_enable_x64" in classify(config).advice
    mesh = RecompileCause(0.0, "words", kind=K.CONTEXT, name="mesh")
    assert classify(mesh).kind == "config/context: mesh"
    assert classify(RecompileCause(0.0, "w", kind=K.GLOBAL_STATE, guard="GLOBAL_STATE",
                                   name="grad_mode")).kind == "grad_mode"


def test_every_kind_has_its_advice():
    for kind in CauseKind:
        k = classify(RecompileCause(0.0, "w", argument="x", before="f32[4]", after="f32[2]",
                                    kind=kind, name="n", dim=0, sync=3, syncs_after=0))
        assert k.kind and k.advice, kind
    assert set(ADVICE) | {K.UNKNOWN, K.BATCH_SIZE, K.SHAPE_DIM, K.RANK, K.DTYPE, K.CONFIG,
                          K.CONTEXT, K.GLOBAL_STATE, K.OBJECT_IDENTITY, K.TENSOR_PROPERTY,
                          K.PYTHON_NUMBER, K.SYMBOLIC_SHAPE, K.INFERENCE_MODE,
                          K.OBJECT_REPLACED} == set(CauseKind)


def test_torch_xla_new_graphs_by_their_sync():
    assert xla_warm_up(2, None) and not xla_warm_up(5, None)
    assert xla_warm_up(9, 0) and not xla_warm_up(9, 4)
    warm = RecompileCause(0.0, "", kind=K.XLA_WARM_UP, sync=2, syncs_after=0)
    late = RecompileCause(0.0, "", kind=K.XLA_NEW_GRAPH, sync=9, syncs_after=4)
    assert warm_up(2, "torch_xla", (warm,)) and not warm_up(2, "torch_xla", (warm, late))
    k = classify(late)
    assert k.kind == "new input shapes" and k.words.startswith(
        "new graph at sync 9, 4 syncs after the last new graph at this line")


def test_kinds_survive_the_wire_and_unknown_ones_travel_on():
    c = RecompileCause(1.0, "new graph", kind=K.XLA_NEW_GRAPH, sync=7, syncs_after=3, dim=0,
                       name="n", guard="size")
    from tpu_info.contract.model import GraphRecord, Snapshot
    s = Snapshot(1.0, graphs=(GraphRecord("ab" * 32, "f", "jax", 1.0, 1.0, causes=(c,)),))
    back = codec.snapshot_from_proto(codec.snapshot_to_proto(s)).graphs[0].causes[0]
    assert back == c
    assert kind_of("") == K.UNKNOWN and kind_of("a_newer_kind") == "a_newer_kind"
    assert typed(RecompileCause(0.0, "first call", kind="a_newer_kind")).kind == K.FIRST_CALL


def test_torch_xla_findings_by_kind_whatever_the_words():
    """Warm-up and new shapes told by the hook's kinds and syncs, not its words."""
    from tpu_info.contract.model import GraphRecord, Snapshot
    from tpu_info.views.findings import recompiles

    def site(*causes: RecompileCause) -> Snapshot:
        first = RecompileCause(0.5, "first call", "train.py:65", kind=K.FIRST_CALL)
        return Snapshot(0.0, graphs=tuple(
            GraphRecord(f"{i:064x}", "xla(train.py:65)", "torch_xla", 1.0, 1.0, compiles=1,
                        compile_seconds_total=0.3, compile_seconds_last=0.3, causes=(c,))
            for i, c in enumerate((first, *causes))))

    warm = RecompileCause(2.0, "a graph", "train.py:65", kind=K.XLA_WARM_UP, sync=2,
                          syncs_after=0)
    short = RecompileCause(3.0, "a graph", "train.py:65", kind=K.XLA_NEW_GRAPH, sync=7,
                           syncs_after=4)
    found = {f.kind: f for f in recompiles(site(warm, short))}
    assert set(found) == {"warm_up", "recompile_new_input_shapes"}, found
    assert "new graph at sync 7, 4 syncs after" in found["recompile_new_input_shapes"].message
    (f,) = recompiles(site(warm))
    assert f.kind == "warm_up"
