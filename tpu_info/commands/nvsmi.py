"""nvidia-smi's spellings tpu-info has no flag for, answered with ours: a
command line that fails to parse and holds one gets a one-line hint naming
the tpu-info equivalent instead of argparse's words (exit code 2, as any
usage error).

Only a line that already failed is looked at, so nothing valid changes
meaning; tokens after ``--`` (``tpu-info run -- python train.py -x``) are the
program's, never read.

Example:
    >>> nvidia_smi_hint(["--query-accounted-apps=pid", "--format=csv"])[:58]
    "nvidia-smi's --query-accounted-apps lists processes that e"
    >>> nvidia_smi_hint(["-q", "-x"])
    "nvidia-smi's -x (XML) is --json here: tpu-info --json (the tpu-info/v1 document)"

nvidia-smi's ``-L``, ``-i``, ``-q``, ``--query-gpu``, ``--query-compute-apps``
and ``--format`` are tpu-info flags (:mod:`tpu_info.commands.args`).
"""

from __future__ import annotations

from collections.abc import Sequence


def nvidia_smi_hint(argv: Sequence[str]) -> str | None:
    """The hint for the first nvidia-smi spelling in ``argv`` (before ``--``),
    or None when there is none."""
    argv = list(argv)
    if "--" in argv:
        argv = argv[:argv.index("--")]
    for i, token in enumerate(argv):
        flag = token.split("=", 1)[0]
        if flag == "--query-accounted-apps":
            return ("nvidia-smi's --query-accounted-apps lists processes that ended: tpu-info "
                    "runs (the runs saved when hooked programs ended; --json for every field); "
                    "those running: tpu-info --query-compute-apps=pid,process_name,used_memory "
                    "--format=csv")
        if flag in ("-x", "--xml-format"):
            return (f"nvidia-smi's {flag} (XML) is --json here: tpu-info --json (the "
                    "tpu-info/v1 document)")
        if flag == "--query" and i + 1 == len(argv):
            return ("--query takes fields here (tpu-info --query index,name --format csv; "
                    "--help-query lists them); nvidia-smi's --query (every detail) is -q here: "
                    "tpu-info -q")
    return None
