"""The torch_xla hook, run in its own environment (torch 2.9.0 + torch-xla 2.9.0).

torch_xla needs exactly torch 2.9.0, so its programs run in the venv that
``tools/xla-env.sh`` builds outside the clone; this file runs in the main
environment and drives them in subprocesses. Without that venv the tests
skip (locally) or fail (in CI, where ``.ci/run`` builds it first).
The debug-file parser is pure Python and is tested here directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

PROGRAM = r"""
import json, os, sys
import torch, torch_xla
import torch_xla.debug.metrics as met
import metrics

metrics.install()  # auto: finds torch_xla; serves on TPU_INFO_PORT
dev = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
model = model.to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def step(n):
    x, y = torch.randn(n, 32, device=dev), torch.randn(n, 1, device=dev)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    torch_xla.sync()  # step line

for n in (8, 8, 16, 8, 8):
    step(n)
z = torch.tensor([1.0, 0.0, 2.0], device=dev)
for _ in range(3):
    torch.nonzero(z)  # no XLA lowering: runs on the CPU
snap = metrics.snapshot()
from tpu_info.views import findings
COUNTERS = ("UncachedCompile", "CachedCompile", "MarkStep", "aten::nonzero")
print(json.dumps({
    "engines": sorted(e.name for e in metrics.installed_engines()),
    "ours": {n: metrics.counter_value(n) for n in COUNTERS},
    "theirs": {n: met.counter_value(n) for n in COUNTERS},
    "fallback_ops": [sorted(metrics.executed_fallback_ops()), sorted(met.executed_fallback_ops())],
    "compile_time": [metrics.metric_data("CompileTime")[:2], met.metric_data("CompileTime")[:2]],
    "graphs": [[g.hash, g.name, g.compiles, g.causes[-1].description, g.causes[-1].location]
               for g in snap.graphs],
    "findings": [f.message for f in findings.find(snap)],
    "devices": [[d.platform, d.memory.reason] for d in snap.devices],
    "address": metrics.exporter().address,
}), flush=True)
sys.stdin.read()
"""


def xla_python() -> str:
    """The xla venv's python, or skip (fail in CI) when it is not built."""
    try:
        path = subprocess.run(["bash", str(ROOT / "tools" / "xla-env.sh"), "--path"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        path = ""
    if path and os.access(path, os.X_OK):
        return path
    reason = ("torch_xla venv not built (run tools/xla-env.sh; it downloads torch 2.9.0 and "
              "torch-xla 2.9.0, about 4 GB)")
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def xla_program(tmp_path_factory):
    py = xla_python()
    env = dict(os.environ)
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG", "PYTHONPATH"):
        env.pop(var, None)
    env.update(PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), TPU_INFO_PORT="0",
               TPU_INFO_RUNTIME_DIR=str(tmp_path_factory.mktemp("rt")))
    proc = subprocess.Popen([py, "-c", PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"torch_xla program failed: {proc.stderr.read()[-3000:]}")
    yield json.loads(line), env
    proc.stdin.close()
    proc.wait(timeout=60)


@pytest.mark.slow
def test_compile_counts_equal_torch_xlas_own(xla_program):
    doc, _ = xla_program
    assert doc["engines"] == ["torch_compile", "torch_xla"]
    assert doc["ours"] == doc["theirs"]
    assert doc["ours"]["UncachedCompile"] == 2 and doc["ours"]["MarkStep"] == 5
    assert doc["compile_time"][0] == doc["compile_time"][1]
    graphs = doc["graphs"]
    assert sum(g[2] for g in graphs) == doc["theirs"]["UncachedCompile"]
    assert len({g[0] for g in graphs}) == 2 and all(len(g[0]) == 32 for g in graphs)
    first, second = graphs
    assert first[3] == "first call" and "torch_xla: user torch_xla.sync" in second[3]
    assert first[4].endswith(f":{_program_line('# step line')}")
    assert doc["devices"] == [["cpu", "xm.get_memory_info: UNIMPLEMENTED: "
                                      "GetAllocatorStats is not supported"]]


@pytest.mark.slow
def test_executed_fallback_ops_answers_as_torch_xlas_own(xla_program):
    doc, _ = xla_program
    ours, theirs = doc["fallback_ops"]
    assert ours == theirs and "aten::nonzero" in ours, doc["fallback_ops"]


@pytest.mark.slow
def test_cpu_fallback_becomes_a_finding(xla_program):
    doc, _ = xla_program
    assert doc["theirs"]["aten::nonzero"] == 3
    assert any(f.startswith("aten::nonzero ran on the CPU 3 times: it falls back")
               for f in doc["findings"]), doc["findings"]


@pytest.mark.slow
def test_tpu_info_report_shows_torch_xla_counters(xla_program):
    doc, env = xla_program
    main_env = dict(env, PYTHONPATH=str(ROOT), COLUMNS="120")
    r = subprocess.run([sys.executable, "-m", "tpu_info", "report", "--target", doc["address"]],
                       capture_output=True, text=True, timeout=60, env=main_env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for needle in ("Counter: UncachedCompile\n  Value: 2", "Counter: aten::nonzero\n  Value: 3",
                   "Counter: xla::addmm", "Metric: CompileTime", "Metric: TransferToDeviceTime",
                   "Metric: OutboundData", "aten::nonzero ran on the CPU 3 times"):
        assert needle in out, needle


def _program_line(marker: str) -> int:
    for i, line in enumerate(PROGRAM.splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(marker)


EQ, DASH = "=" * 80, "-" * 80
BLOCK = f"""
Compilation Analysis: {EQ}
Compilation Analysis: Compilation Cause
Compilation Analysis:   most likely user code trying to access tensor value before torch_xla.sync
Compilation Analysis: Graph Info:
Compilation Analysis:   Graph Hash: 838748c5432d3676498f650bd78f9346
Compilation Analysis:   Number of Graph Inputs: 4
Compilation Analysis:   Number of Graph Outputs: 9
Compilation Analysis: Python Frame Triggered Execution:
Compilation Analysis:   sync (/venv/site-packages/torch_xla/torch_xla.py:87)
Compilation Analysis:   <module> (/home/me/train.py:25)
Compilation Analysis: {DASH}
Compilation Analysis: {EQ}

Post Compilation Analysis: {EQ}
Post Compilation Analysis: Graph input size: 0.000000 GB
Post Compilation Analysis: {EQ}
"""


def test_debug_parser_reads_complete_blocks_only(tmp_path):
    from metrics.engines.torch.xla.debug import DebugTail, parse

    blocks, used = parse(BLOCK)
    assert len(blocks) == 1 and used == len(BLOCK)
    b = blocks[0]
    assert b.cause.startswith("most likely user code")
    assert (b.graph_hash, b.inputs, b.outputs) == ("838748c5432d3676498f650bd78f9346", 4, 9)
    assert b.user_frame(("/venv/",)) == ("<module>", "/home/me/train.py", 25)
    path = tmp_path / "debug.txt"
    cut = BLOCK.index("Python Frame")
    path.write_text(BLOCK[:cut])
    tail = DebugTail(str(path))
    assert tail.read() == []  # half a block: wait for the rest
    with open(path, "a") as f:
        f.write(BLOCK[cut:] + BLOCK)
    assert [x.graph_hash for x in tail.read()] == [b.graph_hash] * 2
    assert tail.read() == []


@pytest.mark.slow
def test_install_before_torch_xla_hooks_it_when_imported(tmp_path):
    code = textwrap.dedent("""
        import metrics
        metrics.install(serve=False)
        import torch, torch_xla
        d = torch_xla.device()
        for n in (3, 4):
            y = (torch.ones(n, device=d) * 2).sum()  # noqa: F841 - kept alive to the sync
            torch_xla.sync()
        s = metrics.snapshot()
        print(s.process.engine, getattr(s.process, "waiting", ""), s.counter("UncachedCompile"))
    """)
    env = dict(os.environ)
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG", "PYTHONPATH"):
        env.pop(var, None)
    env.update(PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path))
    r = subprocess.run([xla_python(), "-c", code], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    # torch_lazy is not hooked nor awaited once torch_xla (which supersedes it) came.
    assert r.stdout.split() == ["torch_compile,torch_xla", "jax", "2"], r.stdout


@pytest.mark.slow
def test_the_hook_never_starts_the_xla_runtime_itself(tmp_path):
    """Scrapes, the report and the saved run's checkpoints read nothing that
    starts the XLA runtime before the program does: a ``torch_xla.launch``
    parent that runs no XLA would hold a PJRT client (its workers' devices,
    on a TPU) and spend its normal end tearing it down (0.2-0.4 s longer
    than without the hook). Once the program started it, devices and the
    rank are read."""
    code = textwrap.dedent("""
        import metrics
        metrics.install(serve=False)
        import torch, torch_xla
        started = torch_xla._XLAC._xla_runtime_is_initialized
        engine = next(e for e in metrics.installed_engines() if e.name == "torch_xla")
        s = metrics.snapshot()
        metrics.metrics_report()
        engine._unit("NotAMetricYet")  # a unit it does not know: no report parsed
        before = [started(), len(s.devices), s.process.process_count]
        (torch.ones(3, device=torch_xla.device()) * 2).sum().item()
        s = metrics.snapshot()
        print(before, [started(), len(s.devices) > 0, s.process.process_count])
    """)
    env = dict(os.environ)
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG", "PYTHONPATH",
                "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    env.update(PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), TPU_INFO_RUNTIME_DIR=str(tmp_path))
    r = subprocess.run([xla_python(), "-c", code], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[0] == "[False, 0, None] [True, True, 1]", r.stdout


LAUNCH_PROGRAM = r'''
import torch_xla.distributed.xla_multiprocessing as xmp  # first: torch finishes inside it
import json, os
import torch
import torch_xla


def dump(who):
    import metrics
    from tpu_info.views import findings
    s = metrics.snapshot()
    doc = {"pid": os.getpid(), "engine": s.process.engine if s.process else None,
           "runtime_started": torch_xla._XLAC._xla_runtime_is_initialized(),
           "graphs": [[g.name, g.compiles, [c.description for c in g.causes]] for g in s.graphs],
           "kinds": sorted({str(c.kind) for g in s.graphs for c in g.causes}),
           "findings": [[f.kind, f.severity, f.location, f.message] for f in findings.find(s)]}
    with open(os.path.join(os.environ["OUT_DIR"], who + ".json"), "w") as f:
        json.dump(doc, f)


def _mp_fn(index):
    dev = torch_xla.device()
    model = torch.nn.Linear(8, 1).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(5):
        x = torch.randn(4, 8, device=dev)
        loss = model(x).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        print("loss", loss.item())  # value read before the sync
        torch_xla.sync()
    dump("worker")


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=())
    dump("parent")
'''


@pytest.mark.slow
def test_launch_worker_owns_its_graphs_and_value_access_is_named(tmp_path):
    """``tpu-info run`` on the standard torch_xla.launch: the idle parent lists
    no graphs, the worker lists its own, the hook installs without a false
    message, and the .item() before the sync is named with its line."""
    prog = tmp_path / "train.py"
    prog.write_text(LAUNCH_PROGRAM)
    env = dict(os.environ)
    for var in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG"):
        env.pop(var, None)
    env.update(PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), OUT_DIR=str(tmp_path),
               TPU_INFO_RUNTIME_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "tpu_info", "run", "--", xla_python(),
                        str(prog)], capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "could not install" not in r.stderr and "without the hook" not in r.stderr, r.stderr
    parent = json.loads((tmp_path / "parent.json").read_text())
    worker = json.loads((tmp_path / "worker.json").read_text())
    assert parent["pid"] != worker["pid"]
    assert parent["graphs"] == [], parent  # the worker's graphs are not the parent's
    # The parent runs no XLA, and the hook's scrapes did not start the runtime
    # there either (a PJRT client held, torn down at its end).
    assert parent["runtime_started"] is False and worker["runtime_started"] is True
    # Both records are gone at their normal ends (the dumps are *.json too).
    assert not [p.name for p in tmp_path.glob("*.json") if p.stem.isdigit()]
    assert "torch_xla" in worker["engine"].split(",")
    line = next(i for i, t in enumerate(LAUNCH_PROGRAM.splitlines(), 1) if "value read" in t)
    found = {f[0]: f for f in worker["findings"]}
    kind, severity, location, message = found["value_access_before_sync"]
    assert location.endswith(f"train.py:{line}") and f"train.py:{line}" in message
    assert "Move the .item()" in message and severity == "warning"
    assert not any("_local_scalar_dense" in f[3] for f in worker["findings"])  # named above
    warm = found["warm_up"]  # step 0 (no Adam state yet) vs step 1
    assert warm[1] == "info" and "not a problem" in warm[3]
    assert not any("Pad" in f[3] or "bucket" in f[3] for f in worker["findings"]), worker
    # The hook typed each cause: the views read the kinds, not the words.
    assert {"xla_value_access", "xla_warm_up"} <= set(worker["kinds"]), worker["kinds"]
    assert "unknown" not in worker["kinds"], worker["kinds"]
