"""Work on the process's other Python threads that competes with the step for
its cores (issue 41: optax's reduce_on_plateau example fed through grain, 16
prefetch threads mapping each example on one core, cost 25-30 % of the step
by A/B and read as "device busy" with no finding). A real JAX loop on one
core fed by a thread pool doing per-example numpy work: its threads' CPU is
said at the pool's function, as the step's share the process's CPU they took;
the same snapshot with the cores free says they ran beside the step; a light
pool says nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.hooked import PRINT_SNAPSHOT, snapshot_printed_by
from tpu_info.contract import catalog
from tpu_info.contract.model import DistributionReading, SiteKind, Snapshot, Unit
from tpu_info.views import thread_work as tw
from tpu_info.views.findings import find

POOL_FED = """
import concurrent.futures as cf, json, os, sys
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core: they compete
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
import metrics; metrics.install(serve=False)
import numpy as np
import jax, jax.numpy as jnp
HEAVY = 1
X = np.random.default_rng(0).integers(0, 255, (1024, 256)).astype(np.uint8)

def prep(i):
    x = X[i].astype(np.float64) / 255.0
    for _ in range(HEAVY * 40):
        x = np.tanh(x) * 1.0001  # LINE prep
    return x.astype(np.float32)

pool = cf.ThreadPoolExecutor(4, thread_name_prefix="prefetch")

def batch(j):
    return np.stack([prep((j * 32 + k) % 1024) for k in range(32)])

@jax.jit
def step(w, x):
    h = x
    for _ in range(6):
        h = jnp.tanh(h @ w)
    return w + 1e-6 * (x.T @ h), h.sum()

w = jnp.zeros((256, 256))
futs = [pool.submit(batch, j) for j in range(4)]
for i in range(300):
    x = futs.pop(0).result()
    futs.append(pool.submit(batch, i + 4))
    w, loss = step(w, x)
    if i % 100 == 0:
        print(i, float(loss), file=sys.stderr)
""" + PRINT_SNAPSHOT


def _line(tag: str) -> int:
    return next(n for n, text in enumerate(POOL_FED.splitlines(), start=1) if f"# LINE {tag}" in text)


def _percent(name: str, value: float) -> DistributionReading:
    return DistributionReading(name, Unit.NUMBER, 20, 20 * value, value, value,
                               percentiles=((50.0, value),))


def _with(s: Snapshot, *ds: DistributionReading) -> Snapshot:
    names = {d.name for d in ds}
    return replace(s, distributions=[d for d in s.distributions if d.name not in names] + list(ds))


@pytest.mark.slow
def test_a_prefetch_pool_competing_for_the_core_is_said_at_its_line(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, POOL_FED)
    sites = [x for x in s.sites if x.kind == SiteKind.THREAD_WORK.value]
    assert sites and "threads 'prefetch'" in sites[0].detail, sites
    if not sites[0].location.startswith("<"):  # (busy at a sample: on a loaded machine
        # they can be waiting for the core at every one)
        assert sites[0].function in ("prep", "batch", "<listcomp>"), sites  # (its work)
        assert sites[0].location.rsplit(":", 1)[0].endswith("prog.py")
    share = s.distribution(catalog.OTHER_THREADS_CPU)
    assert share is not None and share.count >= 3
    found = [f for f in find(s) if f.kind == "per_step_thread_work"]
    if tw.contended(s):  # (one core: the training thread waits for it while they run)
        assert len(found) == 1, [f.message for f in find(s)]
        f = found[0]
        assert f.location in (sites[0].location, None)
        assert 0.2 <= (f.share_of_step or 0.0) <= 1.0, f.message
    # The same threads with the cores free ran beside the step: no finding, said why.
    free = _with(s, _percent(catalog.TRAINING_THREAD_RUN_QUEUE, 1.0),
                 _percent(catalog.PROCESS_RUN_QUEUE, 2.0))
    assert not [f for f in find(free) if f.kind == "per_step_thread_work"]
    assert "spare cores" in tw.not_raised(free, sites[0])
    # Contended: said from the median share of the process's CPU they took.
    busy = _with(s, _percent(catalog.TRAINING_THREAD_RUN_QUEUE, 1.0),
                 _percent(catalog.PROCESS_RUN_QUEUE, 30.0),
                 _percent(catalog.OTHER_THREADS_CPU, 40.0))
    (f,) = [f for f in find(busy) if f.kind == "per_step_thread_work"]
    assert f.share_of_step == pytest.approx(0.40, abs=0.01)
    assert "process's threads waited for a core 30% of the loop's time" in f.message


@pytest.mark.slow
def test_a_light_pool_is_no_finding(tmp_path: Path) -> None:
    s = snapshot_printed_by(tmp_path, POOL_FED.replace("HEAVY = 1", "HEAVY = 0"))
    assert not [f for f in find(s) if f.kind == "per_step_thread_work"]


TORCH_POOL_FED = """
import concurrent.futures as cf, json, os, sys
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
import metrics; metrics.install(engines=["torch_compile"], serve=False)
import numpy as np, torch
torch.set_num_threads(1)
X = np.random.default_rng(0).integers(0, 255, (1024, 256)).astype(np.uint8)

def prep(i):
    x = X[i].astype(np.float64) / 255.0
    for _ in range(40):
        x = np.tanh(x) * 1.0001
    return x.astype(np.float32)

def batch(j):
    return torch.from_numpy(np.stack([prep((j * 32 + k) % 1024) for k in range(32)]))

pool = cf.ThreadPoolExecutor(4, thread_name_prefix="prefetch")
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
futs = [pool.submit(batch, j) for j in range(4)]
for i in range(400):
    x = futs.pop(0).result()
    futs.append(pool.submit(batch, i + 4))
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
from tpu_info.wire.fillers import snapshot_to_proto
print(json.dumps({"proto": snapshot_to_proto(metrics.snapshot()).SerializeToString().hex()}))
"""


@pytest.mark.slow
def test_a_torch_loop_s_prefetch_pool_is_counted_too(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    s = snapshot_printed_by(tmp_path, TORCH_POOL_FED)
    (site,) = [x for x in s.sites if x.kind == SiteKind.THREAD_WORK.value]
    assert "threads 'prefetch'" in site.detail and site.seconds > 0
    share = s.distribution(catalog.OTHER_THREADS_CPU)
    assert share is not None and share.count >= 3
    found = [f for f in find(s) if f.kind == "per_step_thread_work"]
    assert len(found) == (1 if tw.contended(s) else 0), [f.message for f in find(s)]


def test_on_an_accelerator_the_threads_take_no_core_from_its_work() -> None:
    from tpu_info.contract.model import DeviceRecord, MemoryReading, SiteReading, StepsReading

    site = SiteReading("thread_work", "/w/prog.py:12", 20, seconds=5.0, function="prep",
                       detail="4 threads 'prefetch'", timed=20, phase="step")
    s = Snapshot(100.0, uptime_seconds=60.0, sites=(site,),
                 steps=StepsReading(1000, "inferred", "jit(step)", 50.0),
                 devices=(DeviceRecord(0, "TPU v5e", "tpu", MemoryReading(0, 16 << 30)),),
                 distributions=(_percent(catalog.OTHER_THREADS_CPU, 90.0),
                                _percent(catalog.PROCESS_RUN_QUEUE, 40.0)))
    assert not [f for f in find(s) if f.kind == "per_step_thread_work"]
    assert "accelerator" in tw.not_raised(s, site)
