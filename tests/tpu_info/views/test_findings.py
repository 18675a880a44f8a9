"""Findings: rules over one snapshot and across the processes of one job."""

from __future__ import annotations

import os

import pytest

from tpu_info.contract.model import GraphRecord, ProcessRecord, RecompileCause, Snapshot
from tpu_info.views.findings import diverging_graphs, find, recompiles


def _proc(pid: int, hashes: list[str], argv=("python", "train.py")) -> Snapshot:
    return Snapshot(
        taken_at_unix=0.0, process=ProcessRecord(pid=pid, name="train.py", argv=argv),
        graphs=tuple(GraphRecord(h, "jit(train_step)", "jax", 0.0, 0.0, compiles=1)
                     for h in hashes))


def test_processes_of_one_job_with_different_graphs():
    same = diverging_graphs([_proc(1, ["a" * 64]), _proc(2, ["a" * 64])])
    assert same == []
    differ = diverging_graphs([_proc(1, ["a" * 64]), _proc(2, ["b" * 64])])
    assert len(differ) == 1 and "2 processes" in differ[0].message
    assert "jit(train_step)" in differ[0].message
    other_job = diverging_graphs([_proc(1, ["a" * 64]), _proc(2, ["b" * 64], ("python", "x"))])
    assert other_job == []


def test_recompile_finding_names_argument_and_line():
    cause = RecompileCause(2.0, "argument 'batch' changed f32[32,128] -> f32[31,128]",
                           "/src/train.py:88", "batch", "f32[32,128]", "f32[31,128]")
    s = Snapshot(taken_at_unix=0.0, graphs=(
        GraphRecord("a" * 64, "jit(step)", "jax", 1.0, 1.0, compiles=1,
                    compile_seconds_total=0.5, compile_seconds_last=0.5),
        GraphRecord("b" * 64, "jit(step)", "jax", 2.0, 2.0, compiles=1,
                    compile_seconds_total=0.4, compile_seconds_last=0.4, causes=(cause,))))
    (f,) = recompiles(s)
    assert f.kind == "recompile_short_last_batch"
    assert "train.py:88" in f.message and "Pad or bucket the last batch" in f.message
    assert abs(f.seconds_lost - 0.4) < 1e-9


# Each recompile cause kind, from the engines' real texts (JAX 0.10.2 explanations,
# torch 2.13 Dynamo guard failures, torch_xla 2.9 analysis), gets its own words and advice.
_PAD = "Pad or bucket the last batch"
_WEAK_MISS = (
    "TRACING CACHE MISS at /tmp/jx.py:11:14 (<module>):\n  for step defined at /tmp/jx.py:8\n"
    "  all previously seen cache keys differ. For the closest previous key:\n"
    "  different input types:\n  * at lr, now f32[]{weak_type=False} and before "
    "f32[]{weak_type=True}https://docs.jax.dev/en/latest/type_promotion.html#weak-types")


def _recompiled(cause: RecompileCause, name="jit(step)", engine="jax", first_site=None,
                compiles=(1, 1)) -> Snapshot:
    first = (RecompileCause(0.5, "first call", first_site),) if first_site else ()
    return Snapshot(taken_at_unix=0.0, graphs=(
        GraphRecord("a" * 64, name, engine, 1.0, 1.0, compiles=compiles[0],
                    compile_seconds_total=0.5, compile_seconds_last=0.5, causes=first),
        GraphRecord("b" * 64, name, engine, 2.0, 2.0, compiles=compiles[1],
                    compile_seconds_total=0.4, compile_seconds_last=0.4, causes=(cause,))))


def _finding(s: Snapshot):
    (f,) = recompiles(s)  # each finding's kind is its cause's kind
    return f


def test_weak_type_flip_in_clean_words_with_its_advice():
    from metrics.engines.jax.causes import parse_cache_miss
    _, cause = parse_cache_miss(_WEAK_MISS, 2.0)
    f = _finding(_recompiled(cause))
    assert "argument 'lr' changed f32[] (weak) -> f32[] (weak type) at jx.py:11" in f.message
    assert "https://" not in f.message and "weak_type=" not in f.message
    assert "jnp.float32(x)" in f.message and _PAD not in f.message and f.kind == "recompile_weak_type"


def test_weak_type_cause_is_clean_in_the_graph_table_and_json():
    from metrics.engines.jax.causes import parse_cache_miss
    from tpu_info.views.values import last_cause
    _, cause = parse_cache_miss(_WEAK_MISS, 2.0)
    c = last_cause(_recompiled(cause).graphs[1])
    assert c is not None and c.description == "argument 'lr' changed f32[] (weak) -> f32[]"
    assert c.before == "f32[] (weak)" and c.after == "f32[]"


def test_eval_batch_from_a_second_call_site_is_not_a_short_last_batch():
    cause = RecompileCause(2.0, "argument 'batch' changed f32[128,784] -> f32[100,784]",
                           "/src/train.py:52", "batch", "f32[128,784]", "f32[100,784]")
    f = _finding(_recompiled(cause, first_site="/src/train.py:40"))
    assert "second batch size" in f.message and "evaluation" in f.message
    assert _PAD not in f.message and f.severity == "info"


def test_eval_batch_from_a_second_site_in_torch_compile():
    # torch 2.13 Dynamo, training at 32 then evaluating the whole test set at once.
    cause = RecompileCause(2.0, "tensor 'x' size mismatch at index 0. expected 32, actual 1000",
                           "/src/train.py:60", "x", "f32[32,4]", "f32[1000,4]")
    f = _finding(_recompiled(cause, name="forward", engine="torch_compile",
                             first_site="/src/train.py:41"))
    assert "size mismatch at index 0: 32 -> 1000 (second batch size" in f.message
    assert _PAD not in f.message


def test_larger_batch_at_the_same_site_varies():
    cause = RecompileCause(2.0, "tensor 'x' size mismatch at index 0. expected 4, actual 8",
                           "/src/train.py:41", "x", "f32[4,3]", "f32[8,3]")
    f = _finding(_recompiled(cause, name="forward", engine="torch_compile",
                             first_site="/src/train.py:41"))
    assert "(batch size varies)" in f.message and _PAD not in f.message


def test_short_last_batch_keeps_its_advice():
    cause = RecompileCause(2.0, "argument 'batch' changed f32[32,128] -> f32[17,128]",
                           "/src/train.py:40", "batch", "f32[32,128]", "f32[17,128]")
    f = _finding(_recompiled(cause, first_site="/src/train.py:40"))
    assert "(short last batch)" in f.message and _PAD in f.message
    # A JAX program without torch slices its data: no DataLoader to set drop_last on.
    assert "drop_last" not in f.message and "range(0, n - batch + 1, batch)" in f.message


def test_non_batch_dimension_is_bucketed():
    cause = RecompileCause(2.0, "argument 'tokens' changed i32[8,128] -> i32[8,131]",
                           "/src/train.py:40", "tokens", "i32[8,128]", "i32[8,131]")
    f = _finding(_recompiled(cause))
    assert "non-batch dimension" in f.message and "Bucket" in f.message and _PAD not in f.message


def test_dtype_change():
    cause = RecompileCause(2.0, "argument 'x' changed f32[3] -> i32[3]", "t.py:21", "x",
                           "f32[3]", "i32[3]")
    f = _finding(_recompiled(cause))
    assert "(dtype)" in f.message and "one dtype" in f.message and _PAD not in f.message


def test_grad_mode_guard_is_global_state_not_a_batch():
    # Dynamo 2.13: "- 0/0: GLOBAL_STATE changed: grad_mode " (the engine drops "0/0: ").
    cause = RecompileCause(2.0, "GLOBAL_STATE changed: grad_mode", "/src/train.py:70")
    f = _finding(_recompiled(cause, name="forward", engine="torch_compile"))
    assert "(grad_mode)" in f.message and "torch.no_grad()" in f.message
    assert _PAD not in f.message and "bucket" not in f.message.lower()


def _jax_miss(body: str, line: int = 28):
    """A cause parsed from JAX 0.10.2's own explanation text (``body``: its last lines)."""
    from metrics.engines.jax.causes import parse_cache_miss
    _, cause = parse_cache_miss(
        f"TRACING CACHE MISS at /tmp/jx.py:{line}:4 (<module>):\n  for step defined at "
        "/tmp/jx.py:8\n  all previously seen cache keys differ. For the closest previous "
        "key:\n" + body, 2.0, lambda path: {"[0][1]": "times"}.get(path, path))
    return cause


def test_mesh_context_change_is_config_context():
    cause = _jax_miss(
        "  Tracing context doesn't match, e.g. due to config or context manager.\n"
        "  * abstract_mesh_context_manager differs: now AbstractMesh('d': 2, axis_types="
        "(Explicit,), device_kind=cpu, num_cores=None, platform=cpu) and before None")
    f = _finding(_recompiled(cause))
    assert "abstract_mesh_context_manager changed None -> Mesh('d': 2) " \
        "(config/context: mesh) at jx.py:28" in f.message, f.message
    assert "enter the mesh once" in f.message and f.kind == "recompile_config_context_mesh"
    assert _PAD not in f.message and "jax.config.update" not in f.message


def test_config_option_is_named_with_its_advice():
    cause = _jax_miss(
        "  Tracing context doesn't match, e.g. due to config or context manager.\n"
        "  * jax_default_matmul_precision differs: now highest and before None")
    f = _finding(_recompiled(cause))
    assert "jax_default_matmul_precision changed None -> highest (config) at jx.py:28" \
        in f.message and "set it once before the loop" in f.message and f.kind == "recompile_config"
    assert _PAD not in f.message and "mesh" not in f.message


def test_static_argument_value():
    cause = _jax_miss(
        "  different input pytree:\n  * at input path [0][1], now <class "
        "'jax._src.tree_util.Static'> with pytree metadata Static(val=3) and before <class "
        "'jax._src.tree_util.Static'> with pytree metadata Static(val=2), so the pytree node "
        "metadata does not match", 15)
    f = _finding(_recompiled(cause))
    assert "static argument 'times' changed 2 -> 3 (static argument) at jx.py:15" in f.message
    assert "pass it as an array" in f.message and _PAD not in f.message
    assert "structure" not in f.message and f.kind == "recompile_static_argument"


def test_raw_static_text_from_an_older_hook_still_gets_static_advice():
    cause = RecompileCause(
        2.0, "different input pytree; at input path [0][1], now <class "
        "'jax._src.tree_util.Static'> with pytree metadata Static(val=2) and before <class "
        "'jax._src.tree_util.Static'> with pytree metadata Static(val=1), so the pytree node "
        "metadata does not match", "/tmp/jx.py:15")
    assert _finding(_recompiled(cause)).kind == "recompile_static_argument"


def test_pytree_structure():
    cause = _jax_miss(
        "  different input pytree:\n  * at input path [0][0], now <class 'dict'> with 3 "
        "children and before <class 'dict'> with 2 children, so the numbers of children do "
        "not match, with the symmetric difference of key sets: {'d'}", 18)
    f = _finding(_recompiled(cause))
    assert "argument [0][0] changed dict of 2 -> dict of 3 (pytree structure) at jx.py:18" \
        in f.message, f.message
    assert "Keep the structure fixed" in f.message and _PAD not in f.message


def test_sharding_change():
    cause = RecompileCause(2.0, "argument 'x' changed f32[8,4] sharded('d', None) -> "
                           "f32[8,4] sharded(None, 'd')", "t.py:9", "x",
                           "f32[8,4] sharded('d', None)", "f32[8,4] sharded(None, 'd')")
    f = _finding(_recompiled(cause))
    assert "(sharding)" in f.message and "match what the step returns" in f.message
    assert _PAD not in f.message


def test_torch_xla_second_step_is_warm_up():
    cause = RecompileCause(2.0, "new graph (graph inputs 4 -> 9); torch_xla: user "
                           "torch_xla.sync", "train.py:25")
    f = _finding(_recompiled(cause, name="xla(train.py:25)", engine="torch_xla"))
    assert f.kind == "warm_up" and "warm-up" in f.message and "not a problem" in f.message
    assert f.severity == "info" and _PAD not in f.message


def test_every_cause_of_a_graph_counts_not_only_its_latest():
    # Dynamo recompiled one graph for the short batch (dynamic batch dim), then
    # again for no_grad: both kinds are named, each at its own line.
    size = RecompileCause(2.0, "tensor 'x' size mismatch at index 0. expected 32, actual 8",
                          "t.py:75")
    grad = RecompileCause(3.0, "GLOBAL_STATE changed: grad_mode", "t.py:82")
    s = Snapshot(taken_at_unix=0.0, graphs=(
        GraphRecord("a" * 64, "compile(Net.forward)", "torch_compile", 1.0, 1.0, compiles=1,
                    compile_seconds_total=0.5, compile_seconds_last=0.5,
                    causes=(RecompileCause(1.0, "first call", "t.py:75"),)),
        GraphRecord("b" * 64, "compile(Net.forward)", "torch_compile", 2.0, 3.0, compiles=2,
                    compile_seconds_total=0.4, compile_seconds_last=0.2, causes=(size, grad))))
    found = {f.kind: f for f in recompiles(s)}
    assert set(found) == {"recompile_short_last_batch", "recompile_grad_mode"}
    short = found["recompile_short_last_batch"]
    assert short.location == "t.py:75" and "32 -> 8" in short.message and _PAD in short.message
    assert short.seconds_lost == pytest.approx(0.2) and "split evenly" in short.message
    assert found["recompile_grad_mode"].location == "t.py:82"
    assert _PAD not in found["recompile_grad_mode"].message


def _xla_site(*causes: RecompileCause) -> Snapshot:
    first = RecompileCause(0.5, "first call", "train.py:65")
    graphs = [GraphRecord(f"{i:064x}", "xla(train.py:65)", "torch_xla", 1.0, 1.0, compiles=1,
                          compile_seconds_total=0.3, compile_seconds_last=0.3, causes=(c,))
              for i, c in enumerate((first, *causes))]
    return Snapshot(taken_at_unix=0.0, graphs=tuple(graphs))


def test_torch_xla_new_graph_after_steady_steps_is_new_shapes_not_warm_up():
    warm = RecompileCause(2.0, "new graph at sync 2, 0 syncs after the last new graph at this "
                          "line (graph inputs 7 -> 12); torch_xla: user torch_xla.sync",
                          "train.py:65")
    short = RecompileCause(3.0, "new graph at sync 7, 4 syncs after the last new graph at this "
                           "line (same graph inputs and outputs: new shapes or values); "
                           "torch_xla: user torch_xla.sync", "train.py:65")
    found = {f.kind: f for f in recompiles(_xla_site(warm, short))}
    assert set(found) == {"warm_up", "recompile_new_input_shapes"}, found
    f = found["recompile_new_input_shapes"]
    assert "short last batch" in f.message and "drop_last=True" in f.message
    assert f.severity == "warning" and "warm-up" not in f.message
    assert found["warm_up"].severity == "info" and "not a problem" in found["warm_up"].message
    # A device loader syncs before the first step: the second graph is warm-up by its gap.
    late = RecompileCause(2.0, "new graph at sync 4, 0 syncs after the last new graph at this "
                          "line (same graph inputs and outputs: new shapes or values)",
                          "train.py:65")
    (f,) = recompiles(_xla_site(late))
    assert f.kind == "warm_up"


def test_torch_xla_new_graph_with_other_inputs_is_not_called_a_batch_size_problem():
    """A later new graph where torch_xla counted other graph inputs: the step
    touches other tensors; neither shapes nor drop_last are the answer."""
    from tpu_info.contract.cause_kinds import CauseKind
    other = RecompileCause(3.0, "new graph at sync 9, 5 syncs after the last new graph at this "
                           "line (graph inputs 35 -> 77)", "train.py:65",
                           kind=CauseKind.XLA_NEW_GRAPH, sync=9, syncs_after=5,
                           before="35 inputs, 105 outputs", after="77 inputs, 105 outputs")
    (f,) = recompiles(_xla_site(other))
    assert f.kind == "recompile_other_graph_inputs" and f.severity == "warning", f
    assert "35 inputs, 105 outputs -> 77 inputs, 105 outputs" in f.message
    assert "same graph inputs" not in f.message and "drop_last" not in f.message
    assert "batch size" not in f.message and "before the loop" in f.message


def test_a_read_in_a_step_closure_is_information_not_a_read_before_the_sync():
    """torch_xla's analysis says "before torch_xla.sync" for a read in a step
    closure (xm.add_step_closure runs after it): one small graph, once."""
    from tpu_info.contract.cause_kinds import CauseKind
    from tpu_info.contract.model import CounterReading, DistributionReading, Unit
    read = RecompileCause(1.0, "a tensor's value read in a step closure", "train.py:49",
                          kind=CauseKind.XLA_CLOSURE_READ)
    g = GraphRecord("a" * 64, "xla(train.py:49)", "torch_xla", 1.0, 1.0, compiles=1,
                    compile_seconds_total=0.057, compile_seconds_last=0.057, causes=(read,))
    d2h = DistributionReading("TransferFromDeviceTime", Unit.TIME_NS, 12, 6e6, 1e5, 1e6)
    s = Snapshot(taken_at_unix=0.0, graphs=(g,), distributions=(d2h,),
                 counters=(CounterReading("MarkStep", 177),
                           CounterReading("aten::_local_scalar_dense", 12)))
    found = {f.kind: f for f in find(s)}
    f = found["value_read_in_step_closure"]
    assert f.severity == "info" and f.location == "train.py:49", f
    assert "Nothing to change" in f.message and "57 ms" in f.message and "12 in 177" in f.message
    assert "value_access_before_sync" not in found and "value_read" not in found, found
    assert not any("Move the .item()" in x.message for x in found.values())


@pytest.mark.parametrize("ops_a_step, severity", [(600, "warning"), (4, "info")])
def test_torch_xla_eager_mode_is_named_with_its_ops_a_step(ops_a_step, severity):
    """torch_xla's eager mode runs each op as its own graph: a step run op by
    op is told to compile the step; a few ops around a compiled step are fine."""
    from tpu_info.contract.model import DistributionReading, StepsReading, Unit
    ran = DistributionReading("EagerOpExecuteTime", Unit.TIME_NS, ops_a_step * 40, 1e9, 1e3, 1e6)
    built = DistributionReading("EagerOpCompileTime", Unit.TIME_NS, 147, 7.2e9, 1e6, 5e8)
    s = Snapshot(taken_at_unix=0.0, distributions=(ran, built),
                 steps=StepsReading(40, "inferred", "optimizer.step(): 40 calls (Adam)"))
    (f,) = [f for f in find(s) if f.kind == "xla_eager_mode"]
    assert f.severity == severity and f.per_step == ops_a_step, f
    assert f"{ops_a_step:,} a step" in f.message and "147 op graphs compiled (7.2 s)" in f.message
    assert ("torch_xla.compile(step_fn)" in f.message) == (severity == "warning")


def _eager(n_ops: int, big: tuple[tuple[str, float], ...] = ()) -> Snapshot:
    from tpu_info.contract.model import DistributionReading, Unit
    ops = ["jit(add)", "jit(multiply)", "jit(convert_element_type)", "jit(tanh)",
           "jit(broadcast_in_dim)", "jit(_reduce_sum)", "jit(matmul)"]
    graphs = [GraphRecord(f"{i:064x}", ops[i % len(ops)], "jax", 1.0, 1.0, compiles=1,
                          compile_seconds_total=0.03, compile_seconds_last=0.03)
              for i in range(n_ops)]
    graphs += [GraphRecord(f"f{i:063x}", name, "jax", 1.0, 1.0, compiles=1,
                           compile_seconds_total=sec, compile_seconds_last=sec)
               for i, (name, sec) in enumerate(big)]
    total = sum(g.compile_seconds_total for g in graphs)
    ct = DistributionReading("CompileTime", Unit.TIME_NS, len(graphs), total * 1e9, 0.01e9, 20e9)
    return Snapshot(taken_at_unix=0.0, uptime_seconds=total * 2, graphs=tuple(graphs),
                    distributions=(ct,))


def test_many_single_op_compiles_say_wrap_in_jit_not_persistent_cache():
    fs = find(_eager(40))
    eager = [f for f in fs if f.kind == "eager_ops"]
    assert len(eager) == 1 and "40 single-operation graphs compiled" in eager[0].message
    assert "wrap the loop body in jax.jit" in eager[0].message.lower()
    assert not any("persistent compilation cache" in f.message for f in fs)
    assert not list(recompiles(_eager(40)))


def test_a_few_big_graphs_compiled_once_get_the_persistent_cache():
    fs = find(_eager(0, (("jit(train_step)", 20.0), ("jit(eval_step)", 5.0),
                         ("jit(init)", 2.0))))
    (share,) = [f for f in fs if f.kind == "compile_share"]
    assert "persistent compilation cache" in share.message
    assert not any(f.kind == "eager_ops" for f in fs)


def _findings_text(snapshot: Snapshot) -> str:
    from rich.console import Console

    from tpu_info.outputs.render import findings_table
    from tpu_info.views.values import TargetView
    out = findings_table([TargetView("127.0.0.1:8431", snapshot)], None, 160)
    console = Console(width=160, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(out)
    return console.export_text()


def test_no_problems_found_only_when_a_hooked_engine_recorded_something():
    hooked = ProcessRecord(pid=7, name="train.py", engine="jax")
    quiet = _findings_text(Snapshot(taken_at_unix=0.0, process=hooked))
    assert "No problems found" not in quiet and "nothing recorded yet" in quiet, quiet
    unhooked = _findings_text(Snapshot(taken_at_unix=0.0))
    assert "No problems found" not in unhooked and "hook" in unhooked, unhooked
    busy = Snapshot(taken_at_unix=0.0, process=hooked, graphs=(
        GraphRecord("a" * 64, "jit(step)", "jax", 1.0, 1.0, compiles=1),))
    assert "No problems found" in _findings_text(busy)
    from tpu_info.contract.model import StepsReading

    # An eager torch loop (makemore: no compile, 1,001 optimizer steps and its
    # reads counted) recorded plenty: not "nothing recorded yet".
    eager = Snapshot(taken_at_unix=0.0, process=ProcessRecord(pid=7, name="makemore.py",
                                                              engine="torch_compile"),
                     steps=StepsReading(1001, "inferred", "optimizer.step()", 30.0))
    assert "nothing recorded yet" not in _findings_text(eager).lower()


def test_one_finding_per_cause_kind_of_a_function():
    from metrics.engines.jax.causes import parse_cache_miss
    _, weak = parse_cache_miss(_WEAK_MISS, 2.0)
    short = RecompileCause(3.0, "argument 'batch' changed f32[32,128] -> f32[17,128]",
                           "/src/train.py:40", "batch", "f32[32,128]", "f32[17,128]")
    s = Snapshot(taken_at_unix=0.0, graphs=(
        GraphRecord("a" * 64, "jit(step)", "jax", 1.0, 1.0, compiles=1,
                    compile_seconds_total=0.5, compile_seconds_last=0.5),
        GraphRecord("b" * 64, "jit(step)", "jax", 2.0, 2.0, compiles=1,
                    compile_seconds_total=0.4, compile_seconds_last=0.4, causes=(weak,)),
        GraphRecord("c" * 64, "jit(step)", "jax", 3.0, 3.0, compiles=1,
                    compile_seconds_total=0.3, compile_seconds_last=0.3, causes=(short,))))
    fs = sorted(recompiles(s), key=lambda f: -f.seconds_lost)
    assert [f.kind for f in fs] == ["recompile_weak_type", "recompile_short_last_batch"], fs
    assert "recompiled 1 time for weak type" in fs[0].message and "jnp.float32" in fs[0].message
    assert abs(fs[0].seconds_lost - 0.4) < 1e-9 and abs(fs[1].seconds_lost - 0.3) < 1e-9
    assert "(short last batch)" in fs[1].message and _PAD in fs[1].message


def test_idle_torch_xla_launch_parent_is_not_no_problems():
    # pytorch/xla's test_train_mp_mnist.py under tpu-info run: the parent only
    # imported torch_xla (RegisterXLAFunctions) and spawned the worker.
    from tpu_info.contract.model import CounterReading
    parent = ProcessRecord(pid=7, name="test_train_mp_mnist.py", engine="torch_compile,torch_xla")
    s = Snapshot(taken_at_unix=0.0, process=parent,
                 counters=(CounterReading("RegisterXLAFunctions", 1),))
    (f,) = find(s)
    assert f.kind == "nothing_recorded" and "each worker is hooked" in f.message
    assert "No problems found" not in _findings_text(s)
