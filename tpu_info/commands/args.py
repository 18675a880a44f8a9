"""``tpu-info``'s arguments: the parser, each flag's checked type, and the
combinations refused together (:func:`check_combination`).

Every refusal is a :class:`UsageError`: one line on stderr, exit code 2.

Example:
    >>> args = build_parser().parse_args(["-l", "2", "--query", "index,pid"])
    >>> check_combination(args); view_mode(args).interval, view_mode(args).form
    (2.0, 'csv')
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tpu_info.commands import exporter_cli
from tpu_info.commands.completion import SHELLS, CompletionAction
from tpu_info.net.targets import shown


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2. Control characters in the
    message (the user's own argument, echoed) are escaped."""

    def __init__(self, message: str) -> None:
        super().__init__(shown(message))


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's; a line that fails and holds an nvidia-smi spelling
        tpu-info has no flag for (``-x``, ``--query-accounted-apps=...``) gets a
        hint naming ours instead."""
        try:
            return super().parse_args(args, namespace)
        except UsageError:
            import sys

            from tpu_info.commands.nvsmi import nvidia_smi_hint

            hint = nvidia_smi_hint(sys.argv[1:] if args is None else args)
            if hint is None:
                raise
            raise UsageError(hint) from None


class _MetricAction(argparse.Action):
    """``--metric NAME`` appends; a following ``-f FILTER`` attaches to it."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from tpu_info.views.metrics import resolve_or_custom

        try:
            resolve_or_custom(values)
        except ValueError as e:
            raise UsageError(str(e)) from e
        ns.metrics = list(ns.metrics or []) + [[values, None]]


class _FilterAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from tpu_info.views.metrics import parse_filter

        if not ns.metrics:
            raise UsageError(f"{option_string} must follow a --metric NAME")
        try:
            ns.metrics[-1][1] = parse_filter(values)
        except ValueError as e:
            raise UsageError(str(e)) from e


MAX_SECONDS = 86_400.0  # one day: past it, thread waits and gRPC deadlines overflow


def seconds_arg(flag: str, floor: float = 0.0, ceiling: float = MAX_SECONDS
                ) -> Callable[[str], float]:
    """An argparse ``type`` for ``flag``: a finite number of seconds in
    ``(0, ceiling]``, raised to ``floor``; anything else is a :class:`UsageError`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{flag} must be a number of seconds, got {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise UsageError(f"{flag} must be a positive number of seconds, got {text!r}")
        if value > ceiling:
            raise UsageError(f"{flag} is at most {ceiling:g} seconds, got {text!r}")
        return max(value, floor)

    return parse


def target_arg(text: str) -> str:
    """An argparse ``type`` for ``--target``: a checked ``HOST:PORT``."""
    from tpu_info.net.targets import validate_target

    try:
        return validate_target(text)
    except ValueError as e:
        raise UsageError(f"--target: {e}") from e


def _pid(text: str, flag: str = "--pid") -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 1 << 31:
        raise UsageError(f"{flag} must be a process id (a positive integer), got {text!r}")
    return int(text)


def _ids(text: str, flag: str = "-i") -> tuple[str, ...]:
    """``-i``'s ``tpu3,1``: each id as the Devices table names a chip, or its number."""
    ids = tuple(part.strip().lower() for part in text.split(","))
    for i in ids:
        number = i[3:] if i.startswith(("tpu", "gpu")) else i
        if not (number.isascii() and number.isdigit()):
            raise UsageError(f"{flag} takes device ids as the Devices table names them (tpu3 "
                             f"or 3, comma-separated; tpu-info -L lists them), got {text!r}")
    return tuple(dict.fromkeys(ids))


class _IdsAction(argparse.Action):
    """``-i ID[,ID]`` and nvitop's ``--only ID [ID ...]``: one selection of chips
    (``ids``; ``ids_flag`` names the spelling in messages)."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        flag = "--only" if "--only" in self.option_strings else "-i"
        texts = values if isinstance(values, list) else [values]
        ids = [i for text in texts for i in _ids(text, flag)]
        ns.ids = tuple(dict.fromkeys([*(ns.ids or ()), *ids]))
        ns.ids_flag = ns.ids_flag if getattr(ns, "ids_flag", None) else flag


def _pids(text: str) -> list[int]:
    """nvitop's ``--pid``: ``4242,4243`` (or one pid a word)."""
    return [_pid(part.strip(), "--pid") for part in text.split(",")]


def _users(text: str) -> list[str]:
    """nvitop's ``--user``: ``alice,bob`` (or one name a word), names or uids."""
    names = [part.strip() for part in text.split(",")]
    for n in names:
        if not n or not n.isprintable() or any(c.isspace() for c in n):
            raise UsageError(f"--user takes user names or uids (alice,bob), got {text!r}")
    return names


class _ListAction(argparse.Action):
    """A flag whose words each hold a comma-separated list (its ``type`` splits
    one): one flat list (``--pid 1 2,3`` is 1, 2, 3); ``--user`` alone is this
    user, as nvitop's."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        got = [x for word in values for x in word]
        if not values and self.dest == "users":
            from tpu_info.views.selection import this_user

            got = [this_user()]
        setattr(ns, self.dest, list(dict.fromkeys([*(getattr(ns, self.dest) or ()), *got])))


class _QueryAction(argparse.Action):
    """``--query``, and nvidia-smi's ``--query-gpu`` and ``--query-compute-apps``:
    the CSV fields (``query_fields``), the rows they make (``query_rows``),
    the spelling (``query_spelled``) and nvidia-smi's fields with no meaning
    here (``query_unsupported``: one line on stderr says so)."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from tpu_info.outputs.nvsmi_fields import parse_fields, unsupported_line

        flag = self.option_strings[0]
        before = getattr(ns, "query_spelled", None)
        if before and before != flag:
            raise UsageError(f"{before} and {flag} both choose the CSV fields: give one")
        try:
            q = parse_fields(values, flag)
        except ValueError as e:
            raise UsageError(str(e)) from e
        ns.query_fields, ns.query_rows, ns.query_spelled = q.fields, q.per, flag
        ns.query_unsupported = unsupported_line(q)


def _output_file(text: str) -> str:
    if not text or "\0" in text:
        raise UsageError(f"-o must name a file, got {text!r}")
    return text


def _run_file(text: str) -> str:
    if not text or "\0" in text:
        raise UsageError(f"--from must name a saved run's file, got {text!r}")
    return text


def _html_file(text: str) -> str:
    import os

    if not text or "\0" in text:
        raise UsageError(f"--html must name a file, got {text!r}")
    if os.path.isdir(text):
        raise UsageError(f"--html {text!r} is a directory; name the HTML file")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="tpu-info", description="See what your accelerators and the XLA "
                "programs on them are doing.", epilog="Exit codes: 0 all good; 1 some "
                "targets failed; 2 usage error.")
    p.add_argument("-v", "--version", action="store_true",
                   help="print the tpu-info, libtpu and accelerator versions (Google's three "
                        "lines; an object with --json) and exit")
    p.add_argument("-p", "--process", action="store_true",
                   help="show only the processes table (Google's flag)")
    p.add_argument("--all", dest="all_chips", action="store_true",
                   help="list every TPU chip on the host's PCI bus, also those whose device "
                        "node is missing here (by default one line counts them)")
    p.add_argument("-L", "--list-gpus", dest="list_gpus", action="store_true",
                   help="list the devices, one a line, as nvidia-smi -L does (the usable "
                        "chips; every one with --all) and exit")
    p.add_argument("-i", "--id", dest="ids", action=_IdsAction, metavar="ID[,ID...]",
                   help="only these devices in the Devices table, --json, --query, -q and "
                        "-L, as the table names them (tpu3 or 3)")
    p.add_argument("--only", dest="ids", action=_IdsAction, nargs="+", metavar="ID",
                   help="nvitop's --only: the same as -i (--only 0 1, or 0,1)")
    p.add_argument("--only-visible", action="store_true",
                   help="nvitop's: only the devices usable here (the default; --all is its "
                        "opposite)")
    p.add_argument("--pid", dest="pids", action=_ListAction, type=_pids, nargs="+",
                   metavar="PID", help="nvitop's: only these processes in Processes, -p, "
                                       "--json, --query and -q (--pid 4242,4243)")
    p.add_argument("--user", dest="users", action=_ListAction, type=_users, nargs="*",
                   metavar="USER", help="nvitop's: only these users' processes (names or "
                                        "uids; alone: yours), as --pid")
    p.add_argument("-q", dest="detail", action="store_true",
                   help="every detail of each device, one 'key : value' a line, as "
                        "nvidia-smi -q (-i, --all, --pid and --user select)")
    p.add_argument("--streaming", action="store_true",
                   help="look again every --rate seconds (Ctrl-C stops): in place on a "
                        "terminal, one frame appended per look to a pipe or file")
    p.add_argument("-l", "--loop", type=seconds_arg("-l", 0.1), nargs="?", const=0.0,
                   metavar="S", help="nvidia-smi's -l: --streaming every S seconds "
                                     "(default --rate's)")
    p.add_argument("--watch", action="store_true",
                   help="live dashboard on a terminal (q quits, ? lists keys); --rate sets "
                        "its interval")
    p.add_argument("--rate", type=seconds_arg("--rate", 0.1), metavar="S",
                   help="seconds between looks with --streaming or --watch (default 1, "
                        "floor 0.1)")
    p.add_argument("--list_metrics", action="store_true", help="list metric names and exit")
    p.add_argument("--metric", action=_MetricAction, dest="metric_name", metavar="NAME",
                   help="show one metric (repeatable); Google's short names or ours")
    p.add_argument("-f", "--filter", action=_FilterAction, metavar="'percentile:[p50,p90]'",
                   help="percentile columns for the --metric before it")
    p.add_argument("--json", action="store_true",
                   help="print the tpu-info/v1 JSON document (one per line with --streaming); "
                        "with -v, --list_metrics, report or doctor: their JSON form")
    p.add_argument("--query", action=_QueryAction, metavar="FIELD,...", dest="query_fields",
                   help="CSV rows of these fields, nvidia-smi style (e.g. index,name,hbm_used,"
                        "duty_cycle,pid,compiles,step_time; --help-query lists them)")
    p.add_argument("--query-gpu", action=_QueryAction, metavar="FIELD,...", dest="query_fields",
                   help="nvidia-smi's: a CSV row per device, nvidia-smi's field names too "
                        "(index,name,pci.bus_id,memory.used,memory.total,utilization.gpu)")
    p.add_argument("--query-compute-apps", action=_QueryAction, metavar="FIELD,...",
                   dest="query_fields", help="nvidia-smi's: a CSV row per process on a device "
                                             "(pid,process_name,used_memory,gpu_bus_id)")
    p.add_argument("--format", type=_csv_format, metavar="csv[,noheader][,nounits]",
                   dest="csv_format", help="how --query prints (default csv)")
    p.add_argument("--help-query", "--help-query-gpu", "--help-query-compute-apps",
                   dest="help_query", action="store_true",
                   help="list the --query fields (ours and nvidia-smi's) with their units "
                        "and exit")
    p.add_argument("--target", action="append", type=target_arg, default=[], metavar="HOST:PORT",
                   help="also read this hook or libtpu (repeatable)")
    p.add_argument("--targets-file", metavar="FILE", help="HOST:PORT per line (# comments)")
    p.add_argument("--no-discovery", action="store_true",
                   help="read only --target's, not this host's hooked processes and libtpu")
    p.add_argument("--timeout", type=seconds_arg("--timeout"), default=3.0, metavar="S",
                   help="seconds the whole command may take, replies included (default 3)")
    p.add_argument("--no-color", action="store_true", help="plain text, no colours")
    p.add_argument("--completion", action=CompletionAction, choices=SHELLS, metavar="SHELL",
                   help="print the bash or zsh completion script and exit (e.g. in ~/.bashrc: "
                        "source <(tpu-info --completion bash))")
    p.add_argument("--from", dest="from_file", type=_run_file, metavar="FILE",
                   help="read a saved run (tpu-info runs lists them) instead of live targets")
    sub = p.add_subparsers(dest="command",
                           metavar="{report,profile,doctor,run,runs,diff,exporter}")
    json_help = "print it as JSON"
    r = sub.add_parser("report", help="a running program's metrics_report()",
                       description="A hooked program's torch_xla-style metrics_report().")
    who = r.add_mutually_exclusive_group()
    who.add_argument("--pid", type=_pid, help="the hooked process with this pid")
    who.add_argument("--target", dest="report_target", type=target_arg, metavar="HOST:PORT",
                     help="the hooked process (or libtpu) serving at HOST:PORT")
    r.add_argument("--from", dest="from_file", type=_run_file, metavar="FILE",
                   default=argparse.SUPPRESS, help="a saved run instead of a live process")
    r.add_argument("--short", action="store_true", help="short_metrics_report()")
    r.add_argument("--html", type=_html_file, metavar="FILE",
                   help="write a self-contained HTML page instead (step-time plot, compile "
                        "timeline, device memory, findings, graphs); it loads nothing")
    r.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    pr = sub.add_parser("profile", help="capture a Chrome/Perfetto trace of a running program",
                        description="Record a running hooked program into a trace file.")
    who = pr.add_mutually_exclusive_group()
    who.add_argument("--pid", type=_pid, help="the hooked process with this pid")
    who.add_argument("--target", dest="report_target", type=target_arg, metavar="HOST:PORT",
                     help="the hooked process serving at HOST:PORT")
    pr.add_argument("--duration", type=_capture_seconds, default=5.0, metavar="S",
                    help="seconds to record (default 5, at most 300)")
    pr.add_argument("-o", "--output", required=True, type=_output_file, metavar="FILE",
                    help="trace file to write (gzip-compressed if it ends in .gz)")
    pr.add_argument("--device", action="store_true",
                    help="also jax.profiler / torch.profiler traces (the program opts in), "
                         "beside FILE as <name>.device-N.*")
    d = sub.add_parser("doctor", help="explain every N/A and what to do",
                       description="Why each value is N/A, and what to do. It reads what "
                       "tpu-info reads: put --target, --targets-file, --no-discovery and "
                       "--timeout before 'doctor'.")
    d.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    d.add_argument("--from", dest="from_file", type=_run_file, metavar="FILE",
                   default=argparse.SUPPRESS, help="explain a saved run")
    ru = sub.add_parser("runs", help="list the saved runs (newest first)",
                        description="The runs saved when hooked programs ended.")
    ru.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    ru.add_argument("--dir", dest="runs_dir", metavar="DIR",
                    help="list this folder (default: runs/ in the runtime directory)")
    df = sub.add_parser("diff", help="compare two runs (saved files or live HOST:PORT)",
                        description="What changed from run A to run B. Exit codes, as "
                        "diff's: 0 no --fail-on condition held; 1 one held; 2 usage, or a run "
                        "could not be read.")
    df.add_argument("run_a", metavar="A", help="a saved run's file, or HOST:PORT")
    df.add_argument("run_b", metavar="B", help="a saved run's file, or HOST:PORT")
    df.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    df.add_argument("--fail-on", metavar="CONDS",
                    help="exit 1 when one holds, e.g. 'step_time_p50>+5%%,compiles>+0'")
    run = sub.add_parser("run", help="run a Python program with the hook installed",
                         description="Run a command with the hook installed; exits with its "
                         "status.")
    said = run.add_mutually_exclusive_group()
    said.add_argument("--summary", dest="summary", action="store_true", default=None,
                      help="print the end-of-run summary on stderr (default: when stderr is "
                           "a terminal)")
    said.add_argument("--no-summary", dest="summary", action="store_false",
                      help="print no summary")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- python train.py ...")
    exporter_cli.add_parser(sub, seconds_arg, UsageError)
    p.set_defaults(metrics=[])
    return p


def _csv_format(text: str) -> Any:
    from tpu_info.outputs.query import parse_format

    try:
        return parse_format(text)
    except ValueError as e:
        raise UsageError(str(e)) from e


# The device view's flags: (attribute, as the user wrote it).
VIEW_FLAGS = (("streaming", "--streaming"), ("loop", "-l"), ("watch", "--watch"),
              ("process", "-p"), ("metrics", "--metric"), ("list_metrics", "--list_metrics"),
              ("query_fields", "--query"), ("csv_format", "--format"), ("rate", "--rate"),
              ("list_gpus", "-L"), ("ids", "-i"), ("detail", "-q"), ("pids", "--pid"),
              ("users", "--user"))


def _spelled(args: argparse.Namespace, attr: str, flag: str) -> str:
    """``flag`` as the user wrote it: --query-gpu for --query, --only for -i."""
    if attr == "query_fields":
        return getattr(args, "query_spelled", None) or flag
    return (getattr(args, "ids_flag", None) or flag) if attr == "ids" else flag


def check_combination(args: argparse.Namespace) -> None:
    """Refuses flags that would be ignored together (one line, exit 2)."""
    given = [_spelled(args, attr, flag) for attr, flag in VIEW_FLAGS
             if (v := getattr(args, attr, None)) is not None and v is not False and v != []]
    if args.command and given:
        raise UsageError(f"{given[0]} is for the device view, not for '{args.command}' "
                         "(put only --target, --targets-file, --no-discovery, --timeout, "
                         "--json before a subcommand)")
    if args.json and args.command in ("run", "profile", "exporter"):
        raise UsageError(f"--json does not apply to '{args.command}'")
    if getattr(args, "from_file", None):
        _check_from(args)
    if getattr(args, "html", None) and (args.json or args.short):
        raise UsageError(f"report --html writes the whole page: it takes no "
                         f"{'--json' if args.json else '--short'}")
    watch = {"--watch", "--rate", "--pid", "--user"}  # its Processes panel filters at first
    if args.watch and (set(given) - watch or args.json):
        other = next(iter(sorted(set(given) - watch)), "--json")
        raise UsageError(f"--watch is the interactive dashboard: it takes no {other} (for a "
                         "pipe or a file use --streaming)")
    if args.only_visible and args.all_chips:
        raise UsageError("--only-visible (the default: the chips usable here) and --all (every "
                         "chip on the host's PCI bus) contradict each other: give one")
    ids = _spelled(args, "ids", "-i")
    if args.list_gpus and (extra := [f for f in given if f not in ("-L", ids)]
                           + ["--json"] * args.json + ["--from"] * bool(args.from_file)):
        raise UsageError(f"-L lists this host's devices and exits: it takes no {extra[0]}")
    if args.ids and (args.metrics or args.process):
        raise UsageError(f"{ids} selects the Devices table's chips: it takes no "
                         f"{'--metric' if args.metrics else '-p'}")
    _check_processes(args)
    if args.detail and (extra := [f for f in given if f not in ("-q", ids, "--pid", "--user",
                                                                 "-l", "--streaming", "--rate")]
                        + ["--json"] * args.json):
        raise UsageError(f"-q prints every detail of each device: it takes no {extra[0]}")
    if args.list_metrics and (set(given) - {"--list_metrics"}):
        raise UsageError(f"--list_metrics lists names and exits: it takes no "
                         f"{sorted(set(given) - {'--list_metrics'})[0]}")
    if args.rate is not None and args.loop:
        raise UsageError("-l S and --rate S both set the interval: give one")
    if args.rate is not None and not (args.streaming or args.loop is not None or args.watch):
        raise UsageError("--rate sets the interval of --streaming or --watch: add one of them")
    query = _spelled(args, "query_fields", "--query")
    if args.json and (args.process or args.metrics or args.query_fields or args.csv_format):
        raise UsageError(f"--json prints the whole document; -p, --metric and {query}/--format "
                         "choose other outputs: give one (filter the JSON with jq)")
    if args.query_fields and (args.process or args.metrics):
        raise UsageError(f"{query} picks its own fields: drop -p and --metric")
    if args.csv_format and not args.query_fields:
        raise UsageError("--format csv needs --query FIELD,... (or nvidia-smi's --query-gpu or "
                         "--query-compute-apps; see --help-query)")


def _check_processes(args: argparse.Namespace) -> None:
    """nvitop's ``--pid``/``--user`` keep processes: refused where the output
    has none to keep (a row per device, ``--metric``)."""
    flag = "--pid" if args.pids else "--user" if args.users is not None else ""
    if not flag:
        return
    if args.metrics:
        raise UsageError(f"{flag} keeps processes; --metric shows every target's: give one")
    if args.query_fields and (getattr(args, "query_rows", None) == "device" or (
            getattr(args, "query_rows", None) is None
            and any(f.level == "device" for f in args.query_fields))):
        raise UsageError(f"{flag} keeps processes, and {_spelled(args, 'query_fields', '--query')}"
                         " prints a row per device (select devices with -i; a row per process: "
                         "--query-compute-apps or --query with process fields only)")


def _check_from(args: argparse.Namespace) -> None:
    """``--from FILE`` reads one finished run: nothing live goes with it."""
    if args.command in ("run", "profile", "exporter", "runs", "diff"):
        raise UsageError(f"--from reads a saved run for the view, report or doctor, not "
                         f"'{args.command}'")
    live = [flag for flag, on in (("--target", args.target), ("--targets-file",
            args.targets_file), ("--streaming", args.streaming), ("-l", args.loop is not None))
            if on]
    if live:
        raise UsageError(f"--from reads a finished run: it takes no {live[0]}")


def view_mode(args: argparse.Namespace) -> Any:
    """The default view's :class:`~tpu_info.commands.show.Mode` from checked flags."""
    from tpu_info.commands.show import Mode

    if args.query_fields and args.csv_format is None:
        from tpu_info.outputs.query import Format  # only --query prints CSV

        args.csv_format = Format()
    form = ("csv" if args.query_fields else "json" if args.json else
            "detail" if getattr(args, "detail", False) else "table")
    return Mode(form, streaming=args.streaming or args.loop is not None,
                interval=args.loop or args.rate or 1.0)


def _capture_seconds(text: str) -> float:
    value = seconds_arg("--duration")(text)
    if value > 300:
        raise UsageError(f"--duration is at most 300 seconds (5 minutes), got {text!r}")
    return value


