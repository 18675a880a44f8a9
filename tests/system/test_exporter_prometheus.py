"""A real Prometheus scrapes two ``tpu-info exporter``s standing in for two
hosts, each with two ranks of one 4-process JAX job (issue 17, item 1); the
fleet is :mod:`tests.system.fleet`'s, shared with the fleet kit's test.

The ranks are started as a launcher starts them (``$RANK``/``$WORLD_SIZE``,
one JAX process each): the ranks of one ``jax.distributed`` job compile
with their own process index in XLA's options, so JAX's cache keys (our
graph hashes) differ between them even for one SPMD program (measured
here: 2 CPU processes, one global jit, two hashes); the ``computation``
label is the same for them. That path's rank (the ``rank`` label) is
tested in ``tests/metrics/engines/test_ranks.py``.

Rank 1 compiles a graph of another shape than the rest; host B's rank 2
holds far more device memory than its neighbour. PromQL over what the
exporters serve must name that rank and that host.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest

from tests.system.fleet import RANKS, Fleet


@pytest.mark.slow
def test_prometheus_finds_the_odd_rank_and_the_uneven_host(fleet: Fleet):
    up = fleet.query('tpu_info_target_up{job="llama"} == 1')
    assert {(s["metric"]["host"], s["metric"]["rank"]) for s in up} == {
        (r.host, str(r.index)) for r in RANKS}
    chips = fleet.query('tpu_info_chip_hbm_total_bytes{host=~"hostA|hostB"}')
    assert {(s["metric"]["host"], s["metric"]["device"]) for s in chips} == {
        (h, f"tpu{i}") for h in ("hostA", "hostB") for i in range(4)}

    # The rank whose graph no other rank compiled.
    odd = fleet.query("tpu_info_graph_compiles_total and on (graph) "
                      "(count by (graph) (tpu_info_graph_compiles_total) == 1)")
    assert {(s["metric"]["host"], s["metric"]["rank"]) for s in odd} == {
        ("hostA", "1")}, fleet.query("tpu_info_graph_compiles_total")
    # The host whose processes hold uneven device memory.
    per_process = "sum by (host, program, rank) (tpu_info_device_memory_used_bytes)"
    uneven = fleet.query(f"max by (host) ({per_process}) / "
                         f"min by (host) ({per_process}) > 4")
    assert [s["metric"]["host"] for s in uneven] == ["hostB"], uneven

    promtool = shutil.which("promtool")
    if promtool is not None:  # the Debian package ships it beside prometheus
        body = urllib.request.urlopen(fleet.urls["hostB"], timeout=10).read()
        lint = subprocess.run([promtool, "check", "metrics"], input=body,
                              capture_output=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr
