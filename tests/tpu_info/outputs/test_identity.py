"""Labels that name a process across restarts (issue 30, items 3 and 4):
``tpu_info.outputs.identity``."""

from __future__ import annotations

from tpu_info.contract.model import ProcessRecord
from tpu_info.outputs.identity import ProgramLabels, job_rank, program_name


def test_the_rank_label_is_only_a_jobs():
    def rank(index, count, source):
        return job_rank(ProcessRecord(pid=1, name="x", process_index=index,
                                      process_count=count, process_index_source=source))

    assert rank(0, 1, "jax") == ""  # a lone JAX program: jax.process_index() is 0
    assert rank(None, None, "") == "" and job_rank(None) == ""
    assert rank(3, 8, "jax") == "3" and rank(1, 2, "torch.distributed") == "1"
    assert rank(0, None, "env") == "0"  # a launcher's $RANK says so


def test_program_labels_tell_runs_apart_and_survive_restarts():
    labels = ProgramLabels()
    got = labels.assign([("a", "train.py", ""), ("b", "train.py", ""), ("e", "eval.py", "")])
    assert got == {"a": "train.py", "b": "train.py#2", "e": "eval.py"}
    # a restarts (a new process a2): it takes train.py again; b keeps #2.
    got = labels.assign([("b", "train.py", ""), ("a2", "train.py", "")])
    assert got == {"b": "train.py#2", "a2": "train.py"}
    # A process alive but not asked this time keeps its label.
    got = labels.assign([("c", "train.py", "")], alive={"a2", "b", "c"})
    assert got == {"c": "train.py#3"}
    # The ranks of a job need no suffix: the rank tells them apart.
    got = labels.assign([("r0", "train.py", "0"), ("r1", "train.py", "1")])
    assert got == {"r0": "train.py", "r1": "train.py"}
    # A rank learned later moves a process to its (program, rank) label.
    labels.assign([("x", "job.py", ""), ("y", "job.py", "")])
    assert labels.assign([("x", "job.py", "0"), ("y", "job.py", "1")]) == {
        "x": "job.py", "y": "job.py"}


def test_program_name_is_the_scripts_file_name():
    assert program_name(("/w/train.py", "--lr", "1")) == "train.py"
    assert program_name(("-c",)) == "python -c" and program_name(()) == "python"
