"""The hooks type their recompile causes (the kind of change and what changed),
and their older words, read back by the views' one fallback, read the same:
JAX's explanations, a device move, Dynamo's guard failures (pure text: no
JAX or torch needed here; tests/metrics/engines/jax/test_jax_causes.py and
test_torch_compile.py run them on the real engines)."""

from __future__ import annotations

import pytest

from metrics.engines.jax.causes import LoweringHistory, parse_cache_miss
from metrics.engines.torch.compile.guards import parse_recompile_reason
from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import RecompileCause
from tpu_info.views.causes import _typed_from_text, classify, typed

K = CauseKind


def _untyped(c: RecompileCause) -> RecompileCause:
    """The cause as an older hook sent it: the description and the old fields alone."""
    return RecompileCause(c.time_unix, c.description, c.location, c.argument, c.before,
                          c.after, c.via)


_JAX_HEAD = ("TRACING CACHE MISS at /tmp/t.py:9:2 (<module>):\n  for f defined at /tmp/t.py:3\n"
             "  all previously seen cache keys differ. For the closest previous key:\n")
JAX_BODIES = {
    K.BATCH_SIZE: "  different input types:\n  * at x, now f32[5,3] and before f32[8,3]",
    K.SHAPE_DIM: "  different input types:\n  * at x, now f32[8,4] and before f32[8,3]",
    K.DTYPE: "  different input types:\n  * at x, now i32[3] and before f32[3]",
    K.WEAK_TYPE: "  different input types:\n  * at lr, now f32[]{weak_type=False} and before "
                 "f32[]{weak_type=True}https://docs.jax.dev/x",
    K.STATIC_VALUE: "  different input pytree:\n  * at input path [1]['mode'], now <class "
                    "'jax._src.api_util._HashableWithStrictTypeEquality'> with pytree metadata "
                    "Static(val=3) and before <class 'jax._src.api_util._HashableWithStrict"
                    "TypeEquality'> with pytree metadata Static(val=2), so the static values "
                    "differ",
    K.PYTREE: "  different input pytree:\n  * at input path [0][0], now <class 'dict'> with "
              "pytree metadata ('a', 'c') and before <class 'dict'> with pytree metadata "
              "('a', 'b'), so the dict keys differ",
    K.CONFIG: "  Tracing context doesn't match, e.g. due to config or context manager.\n"
              "  * jax_default_matmul_precision differs: now highest and before None",
}


@pytest.mark.parametrize("kind", list(JAX_BODIES))
def test_the_jax_hook_types_its_causes(kind):
    _, c = parse_cache_miss(_JAX_HEAD + JAX_BODIES[kind], 1.0)
    assert c.kind == kind
    assert _typed_from_text(_untyped(c)).kind == kind  # an older hook's words read alike
    assert classify(_untyped(c)) == classify(c)
    if kind in (K.BATCH_SIZE, K.SHAPE_DIM):
        assert c.dim == (0 if kind == K.BATCH_SIZE else 1)
    if kind == K.CONFIG:
        assert c.name == "jax_default_matmul_precision"


def test_the_jax_hook_types_first_calls_and_device_moves():
    _, first = parse_cache_miss("TRACING CACHE MISS at t.py:9 (f):\n  never seen function:\n"
                                "  f id=1 defined at t.py:3", 0.0)
    assert first.kind == K.FIRST_CALL

    class Dev:
        def __init__(self, i: int) -> None:
            self.device_set, self.id = {self}, i

    h = LoweringHistory()
    h.moved("f", ["f32[3]"], [Dev(0)], ["x"])
    moved = h.moved("f", ["f32[3]"], [Dev(1)], ["x"])
    assert moved is not None and moved.kind == K.DEVICE
    assert classify(_untyped(moved)) == classify(moved)


def test_a_new_partition_spec_on_the_same_devices_is_a_sharding_change():
    """flax's fsdp example: state made with P(), the step returns P('model',)
    on the same two devices; JAX logs no explanation."""

    class Spread:
        def __init__(self, spec: str, devices: tuple[int, ...]) -> None:
            self.spec, self.device_set = spec, set(devices)

    h = LoweringHistory()
    h.moved("step", ["f32[8]"], [Spread("P()", (0, 1))], ["state"])
    c = h.moved("step", ["f32[8]"], [Spread("P('model',)", (0, 1))], ["state"])
    assert c is not None and c.kind == K.SHARDING, c
    assert c.description == "argument 'state' changed sharding P() -> P('model',) over 2 devices"
    assert "match what the step returns" in classify(c).advice
    h.moved("step", ["f32[8]"], [Spread("P('model',)", (2, 3))], ["state"])  # other devices
    moved = h.moved("step", ["f32[8]"], [Spread("P()", (0, 1))], ["state"])
    assert moved is not None and moved.kind == K.DEVICE


TORCH_REASONS = [
    ("0/0: tensor 'x' size mismatch at index 0. expected 4, actual 8", K.BATCH_SIZE,
     "tensor 'x' size mismatch at index 0: 4 -> 8"),
    ("0/0: tensor 'x' size mismatch at index 1. expected 3, actual 5", K.SHAPE_DIM,
     "tensor 'x' size mismatch at index 1: 3 -> 5"),
    ("0/0: tensor 'x' dtype mismatch. expected Float, actual Double", K.DTYPE,
     "tensor 'x' dtype changed float32 -> float64"),
    ("0/0: tensor 'x' stride mismatch at index 0. expected 3, actual 1", K.STRIDE,
     "tensor 'x' stride mismatch at index 0: 3 -> 1"),
    ("0/0: tensor 'x' dispatch key set mismatch. expected A, actual B", K.TENSOR_PROPERTY,
     "tensor 'x' dispatch key set changed A -> B"),
    ("0/0: GLOBAL_STATE changed: grad_mode", K.GLOBAL_STATE,
     "grad mode changed (torch.no_grad() around some calls, not others)"),
    ("0/0: ___check_obj_id(L['fn'], 140)", K.OBJECT_IDENTITY,
     "'L['fn']' is another object than when compiled"),
    ("0/0: ___check_type_id(L['n'], 94)", K.TYPE_CHANGE, "'L['n']' changed type"),
    # a second optimizer's compiled step (pytorch/tutorials' compiling_optimizer_lr_scheduler)
    ("2/0: Cache line invalidated because L['self'] got deallocated", K.OBJECT_REPLACED,
     "'self' was freed and a new object took its place (the graph was compiled for the old "
     "one: Cache line invalidated because L['self'] got deallocated)"),
    ("0/0: L['n'] == 2", K.PYTHON_NUMBER, "argument 'n' changed 2 -> 3"),
    ("0/0: L['flag'] == True", K.PYTHON_FLAG, "argument 'flag' changed True -> False"),
    ("0/0: len(L['xs']) == 2", K.SEQUENCE_LENGTH, "len(xs) changed 2 -> 3"),
    # model.train() then model.eval() around one compiled module
    ("0/0: L['self'].training == True", K.MODULE_MODE, "'self' switched train() -> eval()"),
    ("0/0: L['fn']._modules['1'].training == False", K.MODULE_MODE,
     "'fn.1' switched eval() -> train()"),
]


@pytest.mark.parametrize("reason,kind,words", TORCH_REASONS, ids=[k for _, k, _ in TORCH_REASONS])
def test_the_torch_compile_hook_types_its_guard_failures(reason, kind, words):
    c = parse_recompile_reason(reason, 0.0, "t.py:9", {"x": "f32[4,3]"},
                               {"n": "3", "flag": "False", "len(xs)": "3"})
    assert c.kind == kind and c.guard
    assert classify(c).words == words
    old = _untyped(c)  # an older hook: Dynamo's words, before/after as it recorded them
    assert typed(old).kind == kind


def test_a_first_compile_and_unknown_words():
    assert parse_recompile_reason("", 0.0, None).kind == K.FIRST_CALL
    assert parse_recompile_reason("0/0: some new guard", 0.0, None).kind == K.OTHER
    assert classify(RecompileCause(0.0, "some new guard", kind=K.OTHER)).kind == "other"
