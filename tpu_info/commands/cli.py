"""``tpu-info`` command line: ``main(argv) -> int`` parses and dispatches.

    tpu-info                          devices, processes, compilation, transfers, findings
    tpu-info --json                   the same as a versioned JSON document
    tpu-info --target h1:8431 ...     also (or only, with --no-discovery) remote hooks
    tpu-info --streaming --rate 2     look every 2 s: in place on a terminal, appended to
    tpu-info -l 2                     a pipe or file (NDJSON with --json); Ctrl-C stops
    tpu-info --query pid,hbm_used --format csv[,noheader][,nounits]   nvidia-smi-style CSV
    tpu-info --query-gpu=index,memory.used --format=csv   nvidia-smi's own spellings (also
    tpu-info --query-compute-apps=pid,used_memory          -q, -L, -i; nvitop's --only,
                                                           --pid, --user, --only-visible)
    tpu-info --watch [--rate 0.5]     live dashboard (q quits, ? lists keys)
    tpu-info --metric hbm_usage       one metric; Google's names and ours
    tpu-info -v                       Google's three version lines
    tpu-info report [--pid N | --target T] [--json]   a running program's metrics_report()
    tpu-info report --html FILE       the same program as one self-contained HTML page
    tpu-info profile [--pid N | --target T] --duration 5 -o trace.json [--device]
                                      a Chrome/Perfetto trace of a running program
    tpu-info doctor [--json]          why each N/A, and what to do
    tpu-info run -- python train.py   start a program with the hook installed
    tpu-info exporter [--listen H:P]  one Prometheus endpoint: this host's chips and processes

The arguments and the combinations refused together are
:mod:`tpu_info.commands.args`'s; the default view is :mod:`tpu_info.commands.show`'s.
Exit codes: 0 all good; 1 some targets failed (what could be read is still
printed); 2 usage error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from tpu_info.commands.args import (  # noqa: F401  (tui and tests use them from here)
    MAX_SECONDS,
    Parser,
    UsageError,
    build_parser,
    check_combination,
    seconds_arg,
    target_arg,
    view_mode,
)
from tpu_info.contract.errors import TpuInfoError
from tpu_info.net.targets import shown
from tpu_info.outputs.console import degrade_streams, fold, make_console, text_width

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2


def _targets(args: argparse.Namespace) -> list[str]:
    from tpu_info.commands.budget import wait_until
    from tpu_info.net.targets import read_targets_file

    targets = list(args.target)
    if args.targets_file:
        # A pipe or FIFO is read within the command's --timeout (never blocks past it).
        timeout = wait_until(args.deadline, args.timeout) - time.monotonic()
        try:
            targets += read_targets_file(args.targets_file, timeout=timeout)
        except ValueError as e:
            raise UsageError(str(e)) from e
    return targets


def _say(message: object) -> None:
    """One error line on stderr; what a server said is cleaned once more here."""
    from tpu_info.contract.safe import clean

    print(f"tpu-info: {clean(message, 1000)}", file=sys.stderr)


def _gather(args: argparse.Namespace, targets: list[str]):  # type: ignore[no-untyped-def]
    from tpu_info.commands.gather import gather

    if args.from_file:
        from tpu_info.commands.saved import gathered

        return gathered(args.from_file)

    return gather(targets, timeout=args.timeout, deadline=args.deadline,
                  prepare=lambda: _import_outputs(args), use_discovery=not args.no_discovery,
                  probe_libtpu=not args.no_discovery, scan_devices=not args.no_discovery)


def _import_outputs(args: argparse.Namespace) -> None:
    """Imports what prints this look and nothing else (the tables and rich;
    the JSON document; the CSV fields; a --metric table): done while the
    targets are asked (:func:`~tpu_info.commands.gather.gather`'s
    ``prepare``), not before, on a machine where each import takes its time."""
    if args.query_fields:
        import tpu_info.outputs.query
        import tpu_info.views.derived  # noqa: F401
    elif args.detail:
        import tpu_info.outputs.detail  # noqa: F401
    elif args.json:
        import tpu_info.outputs.jsonview  # noqa: F401
    else:
        import tpu_info.outputs.render  # noqa: F401
    if args.metrics:
        import tpu_info.outputs.metric_tables  # noqa: F401


def is_terminal() -> bool:
    """True when stdin and stdout are both a terminal (what the dashboard needs)."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _watch(args: argparse.Namespace, targets: list[str]) -> int:
    """Hands this process over to the dashboard (``python -m tui``): the CLI
    never imports ``tui`` (layering: ``tui -> tpu_info``, not back)."""
    import importlib.util
    import os

    if not is_terminal():
        print("tpu-info: --watch needs a terminal on stdin and stdout; for a pipe or a file "
              "use --streaming (or -l S, --json --streaming)", file=sys.stderr)
        return EXIT_USAGE
    if importlib.util.find_spec("tui") is None:
        print("tpu-info: the dashboard (package 'tui') is not installed", file=sys.stderr)
        return EXIT_USAGE
    argv = [sys.executable, "-m", "tui", "--rate", str(args.rate or 1.0),
            "--timeout", str(args.timeout)]
    for t in targets:
        argv += ["--target", t]
    if args.no_discovery:
        argv.append("--no-discovery")
    if args.all_chips:  # the Devices panel lists the chips not usable here too
        argv.append("--all")
    for flag, dest in (("--user", "users"), ("--pid", "pids")):  # the Processes panel's
        for v in getattr(args, dest, None) or ():  # filter at first (nvitop's --user, --pid)
            argv += [flag, str(v)]
    if args.from_file:
        argv += ["--from", args.from_file]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return EXIT_OK  # not reached


def _show(args: argparse.Namespace, targets: list[str]) -> int:
    from tpu_info.commands.show import select, show

    looked = False

    def look():  # type: ignore[no-untyped-def]
        nonlocal looked
        first = not looked
        if looked:  # each look has its own --timeout; the first one's started with the command
            args.deadline = time.monotonic() + args.timeout
        looked = True
        g = _gather(args, targets)
        try:
            select(args, g)  # -i: the chips named, as this look found them
        except ValueError as e:
            raise UsageError(str(e)) from None
        if first and (unsupported := getattr(args, "query_unsupported", "")):
            _say(unsupported)  # nvidia-smi's fields with no meaning here: [N/A], said once
        if args.metrics:
            from tpu_info.views.metrics import unknown_metric

            if bad := unknown_metric([name for name, _ in args.metrics], g.views):
                raise UsageError(bad)  # a name no target records (custom names are allowed)
        return g

    return show(args, view_mode(args), look, _say)


def _list_devices(args: argparse.Namespace) -> int:
    """``-L``: this host's devices, one a line (none: one line on stderr, exit 1)."""
    from tpu_info.commands.show import device_list
    from tpu_info.host import devices

    try:
        lines, why = device_list(args, devices.scan_local())
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not lines:
        _say(why)
        return EXIT_PARTIAL
    sys.stdout.write("".join(line + "\n" for line in lines))
    return EXIT_OK


def _pick_target(args: argparse.Namespace) -> str:
    """The one hooked process ``report``/``profile`` talk to (--target, --pid,
    or the only one discovered)."""
    from tpu_info.net import discovery

    target = args.report_target
    if target is None:
        found = discovery.find_processes()
        if args.pid is not None:
            match = [p for p in found if p.pid == args.pid]
            if not match:
                raise UsageError(f"no hooked process with pid {args.pid} (hooked pids: "
                                 f"{', '.join(str(p.pid) for p in found) or 'none'})")
            target = match[0].target
        elif len(found) == 1:
            target = found[0].target
        elif not found:
            raise UsageError("no hooked process found; name one with --target HOST:PORT")
        else:
            raise UsageError("several hooked processes: choose one with --pid "
                             f"({', '.join(str(p.pid) for p in found)})")
    return target


def _report(args: argparse.Namespace) -> int:
    from tpu_info.commands.budget import wait_until
    from tpu_info.net.client import Client
    from tpu_info.outputs import textreport

    try:
        if args.from_file:
            from tpu_info.commands.saved import load

            target, snap, _ = load(args.from_file, args.timeout)
        else:
            target = _pick_target(args)
            with Client(target, timeout=args.timeout) as c:
                end = wait_until(args.deadline, args.timeout)  # a real wait, even late
                snap = c.renew(end - time.monotonic(), end).snapshot()
    except TpuInfoError as e:
        _say(e)
        return EXIT_PARTIAL
    if args.html:
        from tpu_info.commands.report_html import write_report

        return write_report(args.html, target, snap, _say)
    if args.json:
        from tpu_info.outputs.jsonview import dumps, report_json

        print(dumps(report_json(target, snap, args.short)))
        return EXIT_OK
    width = text_width()  # a terminal's: lines fold; a pipe's stay whole
    text = (textreport.short_metrics_report(snap, width=width) if args.short
            else textreport.metrics_report(snap, width=width))
    sys.stdout.write(text or "(the process has recorded nothing yet)\n")
    return EXIT_OK


def _profile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tpu_info.commands.profile import profile
    from tpu_info.views.values import clean

    out = Path(args.output)
    try:
        is_dir = out.is_dir()
    except OSError as e:
        raise UsageError(f"-o {clean(args.output)}: {e.strerror or e}") from None
    if is_dir:
        raise UsageError(f"-o {clean(args.output)} is a directory; name the trace file")
    return profile(args, _pick_target(args), out)


def _doctor(args: argparse.Namespace, targets: list[str]) -> int:
    from tpu_info.contract.safe import clean
    from tpu_info.outputs import render

    g = _gather(args, targets)
    pairs = list(g.notes) + [(v.target, v.error) for v in g.failed]
    pairs += render.reasons(g.views, local=g.local)
    pairs += [tuple(line.partition(": ")[::2]) for line in  # "target: words"
              render.hooked_lines(g.views) + render.blind_spot_lines(g.views)]
    pairs = list(dict.fromkeys((clean(w, 1000), clean(r, 1000)) for w, r in pairs))
    if args.json:
        usable = sum(1 for c in g.local.chips if c.usable)
        print(json.dumps({"schema": "tpu-info-doctor/v1", "targets_read": len(g.views),
                          "discovered": g.discovered, "local_accelerators": usable,
                          "local_accelerators_not_usable": len(g.local.chips) - usable,
                          "failed": [clean(v.target) for v in g.failed],
                          "explanations": [{"where": w, "reason": r} for w, r in pairs]},
                         indent=2))
        return EXIT_PARTIAL if g.failed else EXIT_OK
    usable = sum(1 for c in g.local.chips if c.usable)
    hidden = f" ({len(g.local.chips) - usable} more not usable here)" if usable < len(
        g.local.chips) else ""
    head = (f"tpu-info doctor: {len(g.views)} target(s) read, {g.discovered} discovered, "
            f"{usable} local accelerator(s){hidden}")
    for line in fold([head, *(f"  - {w}: {r}" for w, r in pairs)], text_width()):
        print(line)  # one explanation a line in a pipe, folded on a terminal
    if not pairs:
        print("  nothing to explain: every value was read")
    return EXIT_PARTIAL if g.failed else EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from tpu_info.commands.run import HookNotFoundError, run_hooked

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("run needs a command: tpu-info run -- python train.py")
    if any("\0" in a for a in argv):
        raise UsageError(f"run: the command has a NUL byte: {shown(' '.join(argv))}")
    try:
        summary = args.summary if args.summary is not None else sys.stderr.isatty()
        return run_hooked(argv, summary=summary)
    except HookNotFoundError as e:
        print(f"tpu-info: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FileNotFoundError:
        raise UsageError(f"command not found: {argv[0]}") from None


def main(argv: Sequence[str] | None = None, *, started: float | None = None) -> int:
    """Parses ``argv`` and runs the command; returns the exit code.

    ``started`` is the ``time.monotonic()`` the command's ``--timeout``
    counts from (default: now; the ``tpu-info`` command: when its process
    started, :func:`tpu_info.commands.budget.process_started`).
    """
    started = time.monotonic() if started is None else started
    degrade_streams()  # an ASCII-only stdout gets ASCII look-alikes, never an exception
    try:
        args = build_parser().parse_args(argv)
        args.deadline = started + args.timeout  # --timeout is the whole command's
        if args.version:
            from tpu_info.commands.version import version_text
            from tpu_info.host.devices import scan_local

            sys.stdout.write(version_text(scan_local(), as_json=args.json))
            return EXIT_OK
        if args.help_query:
            from tpu_info.outputs import nvsmi_fields, query

            sys.stdout.write(query.help_text() + nvsmi_fields.help_text())
            return EXIT_OK
        check_combination(args)
        if args.list_metrics:
            from tpu_info.outputs.metric_tables import list_metrics_table
            from tpu_info.views.metrics import metric_list

            if args.json:
                print(json.dumps({"metrics": metric_list()}))
            else:
                make_console(args.no_color).print(list_metrics_table())
            return EXIT_OK
        if args.list_gpus:
            return _list_devices(args)
        if args.command == "run":
            return _run(args)
        if args.command == "exporter":
            from tpu_info.commands import exporter_cli

            return exporter_cli.run(args, UsageError)
        if args.command == "report":
            return _report(args)
        if args.command == "profile":
            return _profile(args)
        if args.command in ("runs", "diff"):
            from tpu_info.commands import saved

            run_it = saved.runs_command if args.command == "runs" else saved.diff_command
            return run_it(args, _say)
        targets = _targets(args)
        if args.command == "doctor":
            return _doctor(args, targets)
        if args.watch:
            return _watch(args, targets)
        return _show(args, targets)
    except UsageError as e:
        print(f"tpu-info: {e} (see 'tpu-info --help')", file=sys.stderr)
        return EXIT_USAGE
    except TpuInfoError as e:  # --from FILE that is not a saved run, a target that failed
        _say(e)
        return EXIT_PARTIAL
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # `tpu-info --streaming | head`: the reader has what it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return EXIT_OK


def run() -> None:
    """Console-script entry point: the command's clock starts with its process,
    and it ends as soon as its output is out (:func:`exit_now`)."""
    from tpu_info.commands.budget import process_started

    exit_now(main(started=process_started()))


def exit_now(code: int) -> None:
    """Flushes stdout and stderr and ends the process with ``code`` at once.

    What a normal exit would add is tearing down the interpreter: gRPC's
    channels and threads, every module. It is 20 ms on a quiet machine and
    took 2-3 s at load 20 on 2 cores, after the answer was printed.
    """
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the reader has what it wanted
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
