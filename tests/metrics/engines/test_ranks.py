"""The rank a snapshot carries (``process_index``): engines first, then ``$RANK``."""

from __future__ import annotations

import os

import pytest

from metrics.engines import EngineBase
from metrics.recording import ranks
from metrics.recording.snapshot import job_rank
from tests.conftest import run_python


class _Said(EngineBase):
    def __init__(self, rank: ranks.Rank | None) -> None:
        super().__init__()
        self._rank = rank

    def install(self) -> None: ...

    def uninstall(self) -> None: ...

    def rank(self) -> ranks.Rank | None:
        return self._rank


class _Broken(_Said):
    def rank(self) -> ranks.Rank | None:
        raise RuntimeError("no backend")


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "8"}, ranks.Rank(3, 8, "env")),
    ({"RANK": "3"}, ranks.Rank(3, None, "env")),
    ({"RANK": "x", "WORLD_SIZE": "8"}, None),
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, ranks.Rank(1, 2, "env")),
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4"}, None),  # not global
    ({"RANK": "9", "WORLD_SIZE": "8"}, ranks.Rank(9, None, "env")),  # a count that cannot be
])
def test_rank_from_the_launchers_environment(env, expected):
    assert ranks.from_environment(env) == expected


def test_an_engine_with_several_processes_beats_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "7")
    multi = ranks.Rank(1, 2, "jax")
    assert job_rank([_Broken(None), _Said(multi)]) == multi
    # One process as the engine sees it (no distributed init): the launcher knows better.
    assert job_rank([_Said(ranks.Rank(0, 1, "jax"))]) == ranks.Rank(7, None, "env")
    monkeypatch.delenv("RANK")
    assert job_rank([_Said(ranks.Rank(0, 1, "jax"))]) == ranks.Rank(0, 1, "jax")
    assert job_rank([_Broken(None)]) is None


@pytest.mark.slow
def test_a_jax_program_carries_its_rank_in_the_snapshot():
    out = run_python("""
import jax, jax.numpy as jnp
import metrics
metrics.install(engines=["jax"])
jax.jit(lambda x: x + 1)(jnp.ones(3))
p = metrics.snapshot().process
print(p.process_index, p.process_count, p.process_index_source)
""", env={"JAX_PLATFORMS": "cpu", "RANK": "", "WORLD_SIZE": ""})
    assert out.stdout.split()[-3:] == ["0", "1", "jax"], out.stderr[-2000:]


DISTRIBUTED = """
import os, sys
import jax
jax.distributed.initialize(coordinator_address=os.environ["COORD"], num_processes=2,
                           process_id=int(sys.argv[1]), initialization_timeout=60)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import metrics
from tpu_info.outputs.graph_series import computation_hash
metrics.install(engines=["jax"], serve=False)
p = metrics.snapshot().process
print(p.process_index, p.process_count, p.process_index_source, flush=True)
# One global jit: its cache key (graph hash) differs per rank, its computation does not.
sharding = NamedSharding(Mesh(jax.devices(), ("d",)), PartitionSpec("d"))
x = jax.make_array_from_process_local_data(sharding, np.ones(4, np.float32))
jax.jit(lambda x: (x * 2).sum())(x).block_until_ready()
[g] = metrics.snapshot().graphs
print(g.short_hash, computation_hash(g), flush=True)
os._exit(0)  # no shutdown barrier: the two stop in any order
"""


@pytest.mark.slow
def test_the_ranks_of_a_jax_distributed_job_say_which_they_are():
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS="",
               COORD=f"127.0.0.1:{port}", RANK="")
    procs = [subprocess.Popen([sys.executable, "-c", DISTRIBUTED, str(i)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in (0, 1)]
    outs = [" ".join(line for line in p.communicate(timeout=120)[0].splitlines()
                     if not line.startswith("[Gloo]")).split() for p in procs]
    assert [o[:3] for o in outs] == [["0", "2", "jax"], ["1", "2", "jax"]]
    (graph0, computation0), (graph1, computation1) = (o[3:] for o in outs)
    assert graph0 != graph1 and computation0 == computation1  # the rank-skew rule's label


BEFORE_THE_JOB = """
import os, socket
import jax
from jax._src import xla_bridge
import metrics
metrics.install(engines=["jax"], serve=False)
s = metrics.snapshot()  # what a scrape or the saved run's first checkpoint (1 s) builds
metrics.metrics_report()
started = xla_bridge.backends_are_initialized()
with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
# It raises once any backend started: the hook's reads must not have started one.
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1,
                           process_id=0, initialization_timeout=60)
jax.numpy.ones(3).block_until_ready()
after = metrics.snapshot()
print(started, len(s.devices), s.process.process_count, len(after.devices) > 0,
      after.process.process_count)
"""


@pytest.mark.slow
def test_a_snapshot_before_the_program_joins_its_jax_job_starts_no_backend():
    """The rank probe and the device list wait for the program's first backend:
    ``jax.process_index()`` / ``jax.local_devices()`` start one, and the
    program's own ``jax.distributed.initialize()`` then raised (a hooked
    program that joined its job more than 1 s after ``install()`` crashed)."""
    out = run_python(BEFORE_THE_JOB, env={"JAX_PLATFORMS": "cpu", "RANK": "", "WORLD_SIZE": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-5:] == ["False", "0", "None", "True", "1"], out.stdout
    # In a job, before its first backend: the rank the coordinator gave (the
    # two-process test above reads it so).
