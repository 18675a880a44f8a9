"""Every kind of recompile, on real JAX: named in words (the argument by its
parameter name, old -> new, the kind, the user's line), with the advice that
fits the kind and no other."""

from __future__ import annotations

import functools
import json
import textwrap

import pytest

from tests.conftest import run_python

jax = pytest.importorskip("jax")
jnp = jax.numpy

# Each kind's advice, by a phrase only it uses: a finding may hold its own only.
ADVICE = {
    "weak type": "pass a typed value every time (jnp.float32(x))",
    "dtype": "Cast the input to one dtype at the boundary",
    "static argument": "Each new value of a static argument compiles again",
    "pytree structure": "Keep the structure fixed",
    "config": "set it once before the loop",
    "sharding/device": "keep it on one device, device_put it once",
    "sharding": "match what the step returns",
    "config/context: mesh": "enter the mesh once",
    "batch": "Pad or bucket",
    "persistent cache": "persistent compilation cache",
}



def _slug(kind: str) -> str:
    """A cause kind as its finding's kind (tpu_info.views.findings.cause_kind_name)."""
    from tpu_info.views.causes import CauseAdvice
    from tpu_info.views.findings import cause_kind_name

    return cause_kind_name(CauseAdvice(kind, "", "", "", False))

def _only_its_advice(message: str, kind: str) -> None:
    assert ADVICE[kind] in message, message
    wrong = [a for k, a in ADVICE.items() if k != kind and a in message]
    assert not wrong, (wrong, message)


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, ln in enumerate(f, 1) if marker in ln and "_line(" not in ln)


@pytest.fixture(scope="module")
def findings():
    """One compile of each function, then the variant that recompiles it: the
    findings by function name (compiles are shared by the tests below)."""
    import metrics
    from tpu_info.views.findings import recompiles

    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    x = jnp.ones(3)

    @jax.jit
    def scale(x, lr):
        return x * lr

    scale(x, 0.1)
    scale(x, jnp.float32(0.1))  # weak-type call

    @jax.jit
    def cast(x):
        return x * 2

    cast(x)
    cast(x.astype(jnp.bfloat16))  # dtype call

    @functools.partial(jax.jit, static_argnums=(1,))
    def repeat(x, times):
        return x * times

    repeat(x, 2)
    repeat(x, 3)  # static positional call

    @functools.partial(jax.jit, static_argnames=("mode",))
    def pick(x, *, mode):
        return x + mode

    pick(x, mode=2)
    pick(x, mode=3)  # static keyword call

    def total(tree, x):
        return sum(jax.tree_util.tree_leaves(tree)) * x

    def named(name: str):  # jax.jit names a graph after its function
        def fn(tree, x):
            return total(tree, x)
        fn.__name__ = fn.__qualname__ = name
        return jax.jit(fn)

    apply, stack, swap = named("apply"), named("stack"), named("swap")
    apply({"a": 1.0, "b": 2.0}, x)
    apply({"a": 1.0, "c": 2.0}, x)  # dict keys call
    stack([1.0, 2.0], x)
    stack([1.0, 2.0, 3.0], x)  # list length call
    swap([1.0, 2.0], x)
    swap((1.0, 2.0), x)  # python type call

    @jax.jit
    def layer(params, x):
        return params["layer"]["w"].sum() * x

    layer({"layer": {"w": jnp.ones((4, 8))}}, x)
    layer({"layer": {"w": jnp.ones((4, 9))}}, x)  # leaf path call

    @jax.jit
    def matmul(a, b):
        return a @ b

    matmul(jnp.ones((2, 2)), jnp.ones((2, 2)))
    with jax.default_matmul_precision("highest"):
        matmul(jnp.ones((2, 2)), jnp.ones((2, 2)))  # config call

    @jax.jit
    def add(a, b, c):
        return a + b + c

    add(jnp.ones((2, 5)), jnp.ones((2, 5)), jnp.ones((2, 5)))
    add(jnp.ones((2, 6)), jnp.ones((2, 6)), jnp.ones((2, 6)))  # three arguments call

    @jax.jit
    def once(x):
        return x - 1

    once(x)
    once(x)

    @jax.jit
    def inner_loss(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    @jax.jit
    def outer_step(w, x):
        return w - jax.grad(inner_loss)(w, x)

    outer_step(jnp.ones((4, 4)), jnp.ones((2, 4)))
    inner_loss(jnp.ones((4, 4)), jnp.ones((8, 4)))  # evaluated at the top level call
    snap = metrics.snapshot()
    rec.reset()
    out: dict[str, list] = {"graphs": list(snap.graphs)}
    for f in recompiles(snap):
        out.setdefault(f.message.split(" ", 1)[0], []).append(f)
    return out


def _one(findings, fn: str, kind: str):
    [f] = findings[f"jit({fn})"]
    assert f.kind == _slug(kind), f
    return f


def test_weak_type(findings):
    f = _one(findings, "scale", "weak type")
    assert (f"argument 'lr' changed f32[] (weak) -> f32[] (weak type) at "
            f"test_jax_causes.py:{_line('# weak-type call')}. ") in f.message, f.message
    assert "https://" not in f.message and "weak_type=" not in f.message
    _only_its_advice(f.message, "weak type")


def test_dtype(findings):
    f = _one(findings, "cast", "dtype")
    assert (f"argument 'x' changed f32[3] -> bf16[3] (dtype) at "
            f"test_jax_causes.py:{_line('# dtype call')}. ") in f.message, f.message
    _only_its_advice(f.message, "dtype")


def test_static_argument_by_position_named_from_the_signature(findings):
    f = _one(findings, "repeat", "static argument")
    assert (f"static argument 'times' changed 2 -> 3 (static argument) at "
            f"test_jax_causes.py:{_line('# static positional call')}. ") in f.message, f.message
    assert "[0][1]" not in f.message and "Static(" not in f.message
    _only_its_advice(f.message, "static argument")


def test_static_argument_by_keyword(findings):
    f = _one(findings, "pick", "static argument")
    assert (f"static argument 'mode' changed 2 -> 3 (static argument) at "
            f"test_jax_causes.py:{_line('# static keyword call')}. ") in f.message, f.message
    _only_its_advice(f.message, "static argument")


@pytest.mark.parametrize(("fn", "change", "marker"), [
    ("apply", "dict('a', 'b') -> dict('a', 'c')", "# dict keys call"),
    ("stack", "list of 2 -> list of 3", "# list length call"),
    ("swap", "list -> tuple", "# python type call"),
])
def test_pytree_structure(findings, fn, change, marker):
    f = _one(findings, fn, "pytree structure")
    assert (f"argument 'tree' changed {change} (pytree structure) at "
            f"test_jax_causes.py:{_line(marker)}. ") in f.message, f.message
    assert "<class" not in f.message and "input path" not in f.message
    _only_its_advice(f.message, "pytree structure")


def test_leaf_keeps_its_path(findings):
    [f] = findings["jit(layer)"]
    assert (f"argument params['layer']['w'] changed f32[4,8] -> f32[4,9] (shape change in a "
            f"non-batch dimension) at test_jax_causes.py:{_line('# leaf path call')}. "
            in f.message), f.message


def test_config_option(findings):
    f = _one(findings, "matmul", "config")
    assert (f"jax_default_matmul_precision changed None -> highest (config) at "
            f"test_jax_causes.py:{_line('# config call')}. ") in f.message, f.message
    assert "jax_default_matmul_precision differs between calls" in f.message
    _only_its_advice(f.message, "config")


def test_several_arguments_name_the_first_and_count_the_others(findings):
    [f] = findings["jit(add)"]
    assert ("argument 'a' changed f32[2,5] -> f32[2,6] (shape change in a non-batch "
            "dimension; also 'b', 'c') at test_jax_causes.py:"
            f"{_line('# three arguments call')}. ") in f.message, f.message


def test_first_call_is_not_a_recompile(findings):
    assert "jit(once)" not in findings


def test_a_function_traced_inside_the_step_first_compiles_at_its_top_level_call(findings):
    # neural_sde (s11): jit(loss), traced inside make_step, compiled at the
    # first evaluation; JAX explained the miss against that trace ("argument
    # changed"), and the 8 s compile was a recompile at no finding's line.
    from tpu_info.contract.model import FIRST_CALL

    assert "jit(inner_loss)" not in findings
    (g,) = [g for g in findings["graphs"] if g.name == "jit(inner_loss)"]
    assert [c.description for c in g.causes] == [FIRST_CALL], g.causes
    assert g.causes[0].location.endswith(f":{_line('# evaluated at the top level call')}")


MOVES_PROGRAM = textwrap.dedent("""
    import json, jax, jax.numpy as jnp, metrics
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from tpu_info.views.findings import recompiles
    metrics.install(serve=False)
    d0, d1 = jax.devices()[:2]
    @jax.jit
    def moved(w, x):
        return w * x
    w = jnp.ones(4)
    moved(w, jax.device_put(jnp.ones(4), d0))
    moved(w, jax.device_put(jnp.ones(4), d1))  # device move
    @jax.jit
    def loose(x):
        return x + 1
    loose(jax.device_put(jnp.ones(4), d0))
    loose(jnp.ones(4))  # uncommitted
    mesh = jax.make_mesh((2,), ("d",), axis_types=(AxisType.Explicit,))
    @jax.jit
    def spread(x):
        return x * 2
    spread(jax.device_put(jnp.ones(8), NamedSharding(mesh, P())))
    spread(jax.device_put(jnp.ones(8), NamedSharding(mesh, P("d"))))  # resharded
    @jax.jit
    def meshed(x):
        return x * 3
    meshed(jnp.ones(8))
    with jax.set_mesh(mesh):
        meshed(jnp.ones(8))  # in a mesh
    auto = jax.make_mesh((2,), ("model",), axis_types=(AxisType.Auto,))
    @jax.jit
    def fsdp(state, x):  # flax's fsdp example: made with P(), returned as P('model',)
        return jax.lax.with_sharding_constraint(state * x, NamedSharding(auto, P("model")))
    state = fsdp(jax.device_put(jnp.ones(8), NamedSharding(auto, P())), jnp.ones(8))
    fsdp(state, jnp.ones(8))  # its returned sharding
    jax.config.update("jax_explain_cache_misses", True)  # the user's own flag
    import functools
    @functools.partial(jax.jit, static_argnums=(1,))
    def flagged(x, times):
        return x * times
    flagged(jnp.ones(2), 2)
    flagged(jnp.ones(2), 3)  # with the flag on
    print(json.dumps({f.message.split(" ", 1)[0]: [f.kind, f.message]
                      for f in recompiles(metrics.snapshot())}))
""")


@pytest.fixture(scope="module")
def moves(tmp_path_factory):
    """The program in its own process (two CPU devices, a mesh, the user's flag),
    run from a file, as a user's program is."""
    script = tmp_path_factory.mktemp("moves") / "moves.py"
    script.write_text(MOVES_PROGRAM)
    r = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                   env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _program_line(marker: str) -> int:
    return next(i for i, ln in enumerate(MOVES_PROGRAM.splitlines(), 1) if marker in ln)


@pytest.mark.slow
def test_silent_device_move_is_named(moves):
    """JAX logs no explanation for this recompile (tracing cache hit, lowering
    cache miss): the previous lowering's input shardings name it."""
    kind, message = moves["jit(moved)"]
    assert kind == _slug("sharding/device"), message
    assert (f"argument 'x' moved device 0 -> device 1 (sharding/device) at "
            f"moves.py:{_program_line('# device move')}. ") in message, message
    _only_its_advice(message, "sharding/device")


@pytest.mark.slow
def test_committed_to_uncommitted_is_named(moves):
    kind, message = moves["jit(loose)"]
    assert kind == _slug("sharding/device"), message
    assert (f"argument 'x' moved device 0 -> uncommitted (sharding/device) at "
            f"moves.py:{_program_line('# uncommitted')}. ") in message, message
    _only_its_advice(message, "sharding/device")


@pytest.mark.slow
def test_sharding_change(moves):
    kind, message = moves["jit(spread)"]
    assert kind == _slug("sharding"), message
    assert (f"argument 'x' changed f32[8] -> f32[8@d] (sharding) at "
            f"moves.py:{_program_line('# resharded')}. ") in message, message
    _only_its_advice(message, "sharding")


@pytest.mark.slow
def test_a_spec_change_on_the_same_devices_is_sharding_not_a_move(moves):
    """JAX explains no recompile here either (a mesh without explicit axes):
    the input is on the same two devices, only its partition spec differs,
    so the advice is to match the step's output sharding, not to keep it on
    one device."""
    kind, message = moves["jit(fsdp)"]
    assert kind == _slug("sharding"), message
    assert (f"argument 'state' changed sharding P() -> P('model',) over 2 devices (sharding) "
            f"at moves.py:{_program_line('# its returned sharding')}. ") in message, message
    _only_its_advice(message, "sharding")


@pytest.mark.slow
def test_mesh_context(moves):
    kind, message = moves["jit(meshed)"]
    assert kind == _slug("config/context: mesh"), message
    assert (f"abstract_mesh_context_manager changed None -> Mesh('d': 2) (config/context: "
            f"mesh) at moves.py:{_program_line('# in a mesh')}. ") in message, message
    _only_its_advice(message, "config/context: mesh")


@pytest.mark.slow
def test_names_from_the_signature_with_the_users_own_flag_on(moves):
    kind, message = moves["jit(flagged)"]
    assert kind == _slug("static argument"), message
    assert "static argument 'times' changed 2 -> 3 (static argument) at moves.py:" \
        f"{_program_line('# with the flag on')}. " in message, message


def _parse(body: str):
    from metrics.engines.jax.causes import parse_cache_miss
    return parse_cache_miss("TRACING CACHE MISS at /tmp/t.py:9:2 (<module>):\n  for f defined "
                            "at /tmp/t.py:3\n  all previously seen cache keys differ. For the "
                            "closest previous key:\n" + body, 1.0)[1]


def test_rare_bodies_in_one_clean_line():
    many = _parse("  different input types:\n" + "".join(
        f"  * at a{i}, now f32[{i + 1}] and before f32[{i}]\n" for i in range(5)))
    assert many.description == "argument 'a0' changed f32[0] -> f32[1] (also 'a1', 'a2' and 2 more)"
    counted = _parse("  Tracing context doesn't match, e.g. due to config or context manager.\n"
                     "  * number of tracing context values differs: now 47 and before 46")
    assert counted.description == ("tracing context changed (number of tracing context "
                                   "values: 46 -> 47)")
    assert _parse("  Debug info doesn't match.").description.startswith("debug info changed")
    for c in (many, counted):
        for field in (c.description, c.before, c.after):
            assert "\n" not in (field or "") and "http" not in (field or "")
