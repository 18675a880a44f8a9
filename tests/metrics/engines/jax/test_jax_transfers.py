"""Implicit transfers in JAX, both ways, with the user's line (real JAX on CPU)."""

from __future__ import annotations

import json
import textwrap
import threading

import numpy as np
import pytest

from tests.conftest import run_python
from tests.lines import line_of

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _line_of(text: str) -> int:
    return line_of(__file__, text)


def _here(text: str) -> str:
    return f"{__file__}:{_line_of(text)}"


@pytest.fixture
def xfer(fresh_metrics):
    import metrics

    eng = next(e for e in metrics.installed_engines() if e.name == "jax")
    eng.implicit.clear()
    yield fresh_metrics, eng
    eng.implicit.clear()


def _sites(eng, kind: str) -> dict[str, object]:
    return {s.location: s for s in eng.sites() if s.kind == kind}


def test_float_print_and_if_each_step_are_sync_sites_with_their_lines(xfer, capsys):
    rec, eng = xfer
    x = jnp.arange(8.0)
    for i in range(6):
        loss = jnp.sum(x) * i
        float(loss)  # sync: float
        print(loss)  # sync: print
        if loss > 0:  # sync: bool
            pass
    got = _sites(eng, "sync")
    float_site = got[_here("float(loss)  # sync: float")]
    print_site = got[_here("print(loss)  # sync: print")]
    bool_site = got[_here("if loss > 0:  # sync: bool")]
    assert (float_site.count, float_site.bytes, float_site.detail) == (6, 24, "float()")
    assert (print_site.count, print_site.detail) == (6, "print()/str()")
    assert (bool_site.count, bool_site.bytes) == (6, 6) and "bool()" in bool_site.detail
    assert float_site.function.endswith("test_float_print_and_if_each_step_are_sync_sites"
                                        "_with_their_lines") and float_site.seconds > 0
    assert rec.registry.counter_value("ImplicitTransferFromDevice") == 18
    assert rec.registry.metric_data("InboundData")[:2] == (18, 24 + 24 + 6)
    assert rec.registry.metric_data("TransferFromDeviceTime")[0] == 18


def test_jnp_asarray_of_numpy_each_step_is_an_implicit_host_to_device_site(xfer):
    rec, eng = xfer
    batch = np.ones((64, 32), np.float32)
    for _ in range(5):
        jnp.asarray(batch)  # implicit h2d
    jnp.asarray(jnp.ones(3))  # a jax.Array: nothing moves
    site = _sites(eng, "implicit_to_device")[_here("jnp.asarray(batch)  # implicit h2d")]
    assert (site.count, site.bytes, site.detail) == (5, 5 * batch.nbytes, "jnp.asarray")
    assert len(_sites(eng, "implicit_to_device")) == 1
    assert rec.registry.counter_value("ImplicitTransferToDevice") == 5
    assert rec.registry.counter_value("ImplicitOutboundBytes") == 5 * batch.nbytes
    assert rec.registry.metric_data("TransferToDeviceTime")[0] == 5


def test_device_get_is_counted_once_as_explicit(xfer):
    rec, eng = xfer
    on_device = jnp.arange(100.0)
    jax.device_get(on_device)
    jax.device_get({"a": on_device + 1})
    assert rec.registry.metric_data("InboundData")[:2] == (2, 800)
    assert not rec.registry.counter_value("ImplicitTransferFromDevice")
    assert _sites(eng, "sync") == {}
    host = jax.device_put(np.ones(16, np.float32))  # explicit: the device_put wrapper counts
    assert rec.registry.metric_data("OutboundData")[:2] == (1, 64)
    assert not rec.registry.counter_value("ImplicitTransferToDevice")
    assert host.shape == (16,)


def test_device_get_of_host_data_is_no_transfer_and_a_mixed_tree_counts_its_arrays(xfer):
    """jraph's pad_with_graphs calls device_get on numpy every step: no
    device->host transfer, no wait at its line; only device arrays move."""
    rec, eng = xfer
    graph = {"nodes": np.ones((64, 8), np.float32), "n": np.int32(3), "k": 2.0}
    for _ in range(5):
        jax.device_get(graph)  # host data: nothing moves
    jax.device_get(np.ones(16))
    assert rec.registry.metric_data("InboundData") is None
    assert rec.registry.metric_data("TransferFromDeviceTime") is None
    assert _sites(eng, "device_get") == {}
    jax.device_get({"a": jnp.arange(10.0), "b": np.ones(100)})  # a mixed tree
    assert rec.registry.metric_data("InboundData")[:2] == (1, 40)
    site, = _sites(eng, "device_get").values()
    assert (site.count, site.bytes) == (1, 40)
    kinds = [e.kind for e in rec.events.since(0)[0]]
    assert kinds.count("transfer_from_device") == 1


def test_a_device_put_bound_before_install_is_counted_once_with_its_event(xfer):
    """Every explicit put of host data is counted in one place (the numpy
    shard handler, under JAX's own explicit_device_put mark), also through
    a name bound before install; a put of an array already on the device
    moves nothing and is not a transfer."""
    rec, _ = xfer
    own_put = getattr(jax.device_put, "__wrapped__", jax.device_put)  # `from jax import ...`
    own_put(np.ones(16, np.float32))
    on_device = jax.device_put(np.ones(8, np.float32))
    jax.device_put(on_device)
    assert rec.registry.metric_data("OutboundData")[:2] == (2, 96)
    assert rec.registry.metric_data("TransferToDeviceTime")[0] == 2
    assert not rec.registry.counter_value("ImplicitTransferToDevice")
    kinds = [e.kind for e in rec.events.since(0)[0]]
    assert kinds.count("transfer_to_device") == 2


def test_one_object_owns_the_numpy_argument_of_a_jitted_call(xfer):
    """The jit wrapper's report and the frame walk's "already counted"
    come from JitArguments alone (no file check, no engine default)."""
    from metrics.engines.jax import JaxEngine
    from metrics.engines.jax import calls as jax_calls

    _, eng = xfer
    assert "implicit" not in vars(JaxEngine)
    step = jax.jit(lambda x: x * 2)
    owner = eng.implicit.jit_arguments
    call, timed_call = jax_calls._python_calls(lambda: None, jax_calls.Owner(""), eng.context, 16, 0)
    assert owner.reported_under(call.__code__) and owner.reported_under(timed_call.__code__)
    assert owner.jit_hooked()
    assert not owner.reported_under(jax_calls.hook_jit.__code__)
    step(np.ones(4, np.float32))  # compiles: the shard handler sees it too
    step(np.ones(4, np.float32))
    assert xfer[0].registry.counter_value("ImplicitTransferToDevice") == 2


def test_buffer_protocol_reads_on_cpu_are_named_as_blind_spots(xfer):
    _, eng = xfer
    x = jnp.arange(4.0) * 2
    np.asarray(x)
    np.array(x)
    jnp.sum(x).item()
    memoryview(x)
    assert _sites(eng, "sync") == {}  # really not seen: zero-copy, no _value read
    spots = eng.blind_spots()
    assert any(s.startswith("np.asarray(x), np.array(x), x.item() and memoryview(x)")
               and "CPU" in s for s in spots)
    # jax.jit is wrapped here: what it still misses, not the unwrapped sentence
    assert any("numpy arguments of functions jitted before metrics.install()" in s
               for s in spots), spots
    assert not any("only the first call of each signature" in s for s in spots)


def test_host_arguments_from_the_jit_wrapper_count_bytes_untimed(xfer):
    rec, eng = xfer
    for _ in range(3):
        eng.implicit.host_arguments(4096, "numpy argument of jit(step)")  # from jit wrapper
    site = _sites(eng, "implicit_to_device")[_here("host_arguments(4096, \"numpy argument")]
    assert (site.count, site.bytes, site.seconds) == (3, 3 * 4096, 0.0)
    assert site.detail == "numpy argument of jit(step)"
    assert rec.registry.metric_data("OutboundData")[:2] == (3, 3 * 4096)
    assert (rec.registry.metric_data("TransferToDeviceTime") or (0,))[0] == 0


def test_four_threads_reading_give_exactly_every_read(xfer):
    rec, eng = xfer
    x = jnp.float32(3.0) * 2

    def reader() -> None:
        for _ in range(5_000):
            float(x)  # threaded sync

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _sites(eng, "sync")[_here("float(x)  # threaded sync")].count == 20_000
    assert rec.registry.counter_value("ImplicitTransferFromDevice") == 20_000


def test_a_failing_hook_is_counted_and_the_read_still_works(xfer, monkeypatch):
    rec, eng = xfer

    class Broken(dict):
        def get(self, *a):
            raise RuntimeError("boom")

    monkeypatch.setattr(eng.implicit, "_codes", Broken())
    before = rec.registry.counter_value("HookErrors") or 0
    assert float(jnp.float32(2.5) * 2) == 5.0
    assert jnp.asarray(np.ones(3)).shape == (3,)
    assert (rec.registry.counter_value("HookErrors") or 0) - before >= 2  # sync, stage


def test_sites_are_bounded_per_kind(xfer):
    _, eng = xfer
    x = jnp.float32(1.0) * 1
    code = "\n".join("float(x)" for _ in range(300))
    exec(compile(code, "/tmp/many_lines.py", "exec"), {"x": x})  # noqa: S102
    sync = [s for s in eng.sites() if s.kind == "sync"]
    assert len(sync) == 257 and sum(s.count for s in sync) == 300
    assert any(s.location == "(other sites)" and s.count == 44 for s in sync)


def _fold_result(eng, rec, records, one_site_path):
    from metrics.engines.jax import implicit as jt

    impl = eng.implicit
    impl.clear()
    rec.registry.clear_all()
    if not one_site_path:
        impl._fold_one_site = lambda flat: False  # the grouped (numpy) path only
    try:
        impl._fold([field for r in records for field in r])
    finally:
        impl.__dict__.pop("_fold_one_site", None)
    reg = rec.registry
    sites = sorted((k[0], k[2], s.code is not None, s.detail, s.count, s.bytes, s.ns, s.last_end,
                    s.occurrences, s.last_step)
                   for k, s in impl._sites.items())
    counters = [reg.counter_value(n) for n in ("ImplicitTransferToDevice",
                                                "ImplicitTransferFromDevice",
                                                "ImplicitOutboundBytes", "ImplicitInboundBytes")]
    dists = [reg.metric_data(n) for n in ("TransferToDeviceTime", "TransferFromDeviceTime",
                                          "OutboundData", "InboundData")]
    assert jt.FIELDS == 8
    return sites, counters, dists


@pytest.mark.parametrize("kind", [0, 1, 2, 3, 4])
def test_the_one_site_fold_counts_what_the_grouped_fold_counts(xfer, kind):
    """A batch from one line (the usual one) folds on a shortcut; it must
    give exactly what the general, grouped fold gives."""
    rec, eng = xfer
    code = _fold_result.__code__
    # (the step each ran in: five reads a step, then one a step)
    records = [(kind, code, 42, "float()", 1000 * i, 1000 * i + 7 + i, 4 + i % 3,
                i // 5 if i < 30 else i) for i in range(50)]
    fast = _fold_result(eng, rec, records, one_site_path=True)
    grouped = _fold_result(eng, rec, records, one_site_path=False)
    assert fast == grouped
    assert [site[-2:] for site in fast[0]] == ([(6 + 20, 49)] if kind in (0, 1, 4) else [])
    mixed = [*records, (kind, code, 43, "float()", 10**6, 10**6 + 5, 8, 7)]  # a second line
    assert _fold_result(eng, rec, mixed, True) == _fold_result(eng, rec, mixed, False)


MESH = textwrap.dedent("""
    import json, os
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((2,), ("d",))
    # Jitted before install: not the hook's jax.jit wrapper, so only the
    # numpy shard handlers see its numpy arguments (on every call).
    before = jax.jit(lambda x: x * 2, in_shardings=NamedSharding(mesh, P("d")))
    import metrics
    metrics.install(engines=["jax"], serve=False)
    eng = next(e for e in metrics.installed_engines() if e.name == "jax")
    after = jax.jit(lambda x: x * 3, in_shardings=NamedSharding(mesh, P("d")))
    batch = np.ones((8, 16), np.float32)
    for _ in range(7):
        before(batch)  # MESH CALL
    jax.device_put(batch, NamedSharding(mesh, P("d")))
    # The hook's jax.jit wrapper reports the call's numpy arguments itself,
    # so the shard hook must not count them again.
    for _ in range(3):
        after(batch)  # WRAPPED CALL
    print(json.dumps([[s.kind, s.location, s.count, s.bytes, s.detail] for s in eng.sites()]))
    reg = metrics.recorder().registry
    print(json.dumps([reg.counter_value("ImplicitTransferToDevice"),
                      reg.metric_data("OutboundData")[:2]]))
""")


@pytest.mark.slow
def test_numpy_into_a_jitted_function_on_a_mesh_is_counted_each_call(tmp_path):
    script = tmp_path / "mesh_prog.py"
    script.write_text(MESH)
    r = run_python(f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))",
                   env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                        "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
    sites_line, counts_line = r.stdout.strip().splitlines()[-2:]
    line = next(i for i, t in enumerate(MESH.splitlines(), 1) if "# MESH CALL" in t)
    wrapped_line = next(i for i, t in enumerate(MESH.splitlines(), 1) if "# WRAPPED CALL" in t)
    sites = {s[1]: s for s in json.loads(sites_line) if s[0] == "implicit_to_device"}
    assert set(sites) == {f"{script}:{line}", f"{script}:{wrapped_line}"}, sites
    _, _, count, nbytes, detail = sites[f"{script}:{line}"]
    assert count == 7 and nbytes == 7 * 8 * 16 * 4 and "jitted call" in detail
    _, _, count, nbytes, detail = sites[f"{script}:{wrapped_line}"]
    assert (count, nbytes, detail) == (3, 3 * 8 * 16 * 4, "numpy argument of jit(<lambda>)")
    implicit, outbound = json.loads(counts_line)
    assert implicit == 10 and outbound == [11, 11 * 8 * 16 * 4]  # + the explicit device_put


def test_snapshot_over_grpc_carries_sites_and_blind_spots(xfer):
    import metrics
    from metrics import export
    from tpu_info.net.client import Client

    _, eng = xfer
    x = jnp.arange(3.0) + 1
    for _ in range(4):
        float(jnp.sum(x))  # served sync
    exporter = export.start(metrics.snapshot, port=0)
    try:
        with Client(exporter.address, timeout=10) as c:
            got = c.snapshot()
    finally:
        exporter.stop(grace=0)
    site = next(s for s in got.sites if s.location == _here("float(jnp.sum(x))  # served sync"))
    assert (site.kind, site.count, site.bytes, site.detail) == ("sync", 4, 16, "float()")
    assert any("zero-copy buffer protocol" in b for b in got.blind_spots)


def test_transfers_table_shows_the_implicit_split(xfer):
    import metrics
    from tpu_info.outputs.render import render_text
    from tpu_info.views.values import TargetView, transfer_stats

    x = jnp.arange(4.0) + 1
    for _ in range(3):
        float(jnp.sum(x))
    jax.device_get(x)
    jnp.asarray(np.ones(256, np.float32))
    snap = metrics.snapshot()
    h2d, d2h = transfer_stats(snap)
    assert (d2h.count, d2h.implicit, d2h.implicit_bytes) == (4, 3, 12)
    assert (h2d.count, h2d.implicit, h2d.implicit_bytes) == (1, 1, 1024)
    text = render_text([TargetView("t:1", snap)], width=160)
    assert "4 (3 implicit)" in text and "1 (1 implicit)" in text


FORK = textwrap.dedent("""
    import os, jax, jax.numpy as jnp, metrics
    metrics.install(engines=["jax"], serve=False)
    eng = next(e for e in metrics.installed_engines() if e.name == "jax")
    x = jnp.float32(2.0) * 2
    eng.implicit._lock.acquire()  # as if a thread of the parent read sites at the fork
    pid = os.fork()
    if pid == 0:
        for _ in range(5_000):
            float(x)
        n = sum(s.count for s in eng.sites() if s.kind == "sync")
        os._exit(0 if n == 5_000 else 3)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""")


@pytest.mark.slow
def test_a_fork_child_records_syncs_though_the_parent_held_the_site_lock():
    r = run_python(FORK, timeout=60, env={"JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "0"


DEGRADED = textwrap.dedent("""
    import json
    import jax, numpy as np
    from jax._src.interpreters import pxla
    del pxla._shard_np_array  # as in a JAX that renamed it
    import metrics
    metrics.install(engines=["jax"], serve=False)
    eng = next(e for e in metrics.installed_engines() if e.name == "jax")
    float(jax.numpy.ones(3).sum())
    jax.device_put(np.ones(4, np.float32))  # counted by the device_put wrapper instead
    print(json.dumps([eng.blind_spots(), eng.degraded,
                      [s.detail for s in eng.sites() if s.kind != "eager_op"],
                      metrics.recorder().registry.metric_data("OutboundData")[:2]]))
""")

# JAX without its explicit_device_put mark: jax.device_put is wrapped and the
# shard handler's frame walk leaves those puts to the wrapper.
NO_MARK = textwrap.dedent("""
    import json
    import jax, numpy as np
    import jax._src.lib as lib
    lib.guard_lib = None
    import metrics
    metrics.install(engines=["jax"], serve=False)
    jax.device_put(np.ones(4, np.float32))
    jax.numpy.asarray(np.ones(2, np.float32))
    reg = metrics.recorder().registry
    print(json.dumps([hasattr(jax.device_put, "__wrapped__"),
                      reg.metric_data("OutboundData")[:2],
                      reg.counter_value("ImplicitTransferToDevice")]))
""")


@pytest.mark.slow
def test_without_jax_s_explicit_put_mark_a_put_is_counted_once_by_a_wrapper():
    r = run_python(NO_MARK, env={"JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [True, [2, 24], 1]


@pytest.mark.slow
def test_a_missing_private_name_degrades_with_a_reason_and_a_blind_spot():
    r = run_python(DEGRADED, env={"JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
    spots, degraded, details, outbound = json.loads(r.stdout.strip().splitlines()[-1])
    assert any(s.startswith("numpy arguments of jitted calls on several devices are not "
                            "counted: pxla.shard_arg_handlers/_shard_np_array missing")
               for s in spots)
    assert any("_shard_np_array missing" in d for d in degraded)
    assert details == ["float()"]  # the other hooks work
    assert outbound == [1, 16]
