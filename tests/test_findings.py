"""Findings: rules over one snapshot and across the processes of one job."""

from __future__ import annotations

from tpu_info.findings import diverging_graphs, find
from tpu_info.model import GraphRecord, ProcessRecord, RecompileCause, Snapshot


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
    (f,) = [f for f in find(s) if f.kind == "recompile"]
    assert "train.py:88" in f.message and "Pad or bucket the last batch" in f.message
    assert abs(f.seconds_lost - 0.4) < 1e-9
