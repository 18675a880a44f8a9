"""nvidia-smi's spellings, answered with ours: a command line that fails to
parse and holds one gets a one-line hint naming the tpu-info equivalent
instead of argparse's words (exit code 2, as any usage error).

Only a line that already failed is looked at, so nothing valid changes
meaning; tokens after ``--`` (``tpu-info run -- python train.py -q``) are the
program's, never read.

Example:
    >>> nvidia_smi_hint(["--query-gpu=index,memory.used", "--format=csv"])
    "nvidia-smi's --query-gpu is --query here: tpu-info --query index,memory.used --format csv"
    >>> nvidia_smi_hint(["-q"])[:40]
    "nvidia-smi's -q (every detail) is: tpu-i"

nvidia-smi's ``-L`` and ``-i`` are tpu-info flags (:mod:`tpu_info.commands.args`).
"""

from __future__ import annotations

from collections.abc import Sequence

# nvidia-smi --query-compute-apps fields with no alias of the same name here.
_APP_FIELDS = {"name": "process", "process_name": "process"}
_DEFAULT_APPS = "pid,process,engine"
_DEVICE_ROW = "index,name,hbm_used,duty_cycle"


def _value(argv: Sequence[str], i: int, flag: str) -> str | None:
    """The value of ``flag`` at ``argv[i]`` (``--flag=V`` or ``--flag V``)."""
    token = argv[i]
    if token.startswith(flag + "="):
        return token[len(flag) + 1:]
    if len(flag) == 2 and token.startswith(flag) and len(token) > 2:  # -i0
        return token[2:]
    if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
        return argv[i + 1]
    return None


def _fields(text: str | None, mapping: dict[str, str], default: str,
            level: str | None = None) -> str:
    """The user's fields that --query knows (nvidia-smi names mapped; only
    those of ``level`` when given), else ``default``."""
    from tpu_info.outputs.query import parse_query

    kept = []
    for name in (text or "").split(","):
        name = mapping.get(name.strip(), name.strip())
        try:
            (field,) = parse_query(name)
        except ValueError:
            continue
        if name not in kept and level in (None, field.level):
            kept.append(name)
    return ",".join(kept) or default


def _format(argv: Sequence[str]) -> str:
    """The user's ``--format`` when --query takes it, else ``csv``."""
    from tpu_info.outputs.query import parse_format

    for i, token in enumerate(argv):
        if token == "--format" or token.startswith("--format="):
            value = _value(argv, i, "--format")
            try:
                if value is not None:
                    parse_format(value)
                    return value
            except ValueError:
                pass
    return "csv"


def nvidia_smi_hint(argv: Sequence[str]) -> str | None:
    """The hint for the first nvidia-smi spelling in ``argv`` (before ``--``),
    or None when there is none."""
    argv = list(argv)
    if "--" in argv:
        argv = argv[:argv.index("--")]
    for i, token in enumerate(argv):
        flag = token.split("=", 1)[0]
        if flag == "--query-gpu":
            fields = _fields(_value(argv, i, flag), {}, _DEVICE_ROW)
            return (f"nvidia-smi's --query-gpu is --query here: tpu-info --query {fields} "
                    f"--format {_format(argv)}")
        if flag in ("--query-compute-apps", "--query-accounted-apps"):
            fields = _fields(_value(argv, i, flag), _APP_FIELDS, _DEFAULT_APPS, "process")
            return (f"nvidia-smi's {flag} is --query with process fields here (a row per "
                    f"process): tpu-info --query {fields} --format {_format(argv)} "
                    "(device memory per process: tpu-info -p)")
        if flag == "-q" or (flag == "--query" and i + 1 == len(argv)):
            lone = ("--query takes fields here (tpu-info --query index,name --format csv; "
                    "--help-query lists them); " if flag == "--query" else "")
            return (f"{lone}nvidia-smi's {flag} (every detail) is: tpu-info (every section), "
                    "tpu-info --json (every field), tpu-info doctor (why a value is N/A)")
    return None
