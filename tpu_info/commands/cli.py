"""``tpu-info`` command line: ``main(argv) -> int`` parses and dispatches.

    tpu-info                          devices, processes, compilation, transfers, findings
    tpu-info --json                   the same as a versioned JSON document
    tpu-info --target h1:8431 ...     also (or only, with --no-discovery) remote hooks
    tpu-info --streaming --rate 2     refresh in place every 2 s (Ctrl-C stops)
    tpu-info --watch [--rate 0.5]     live dashboard (q quits, ? lists keys)
    tpu-info --metric hbm_usage       one metric; Google's names and ours
    tpu-info report [--pid N | --target T]   a running program's metrics_report()
    tpu-info profile [--pid N | --target T] --duration 5 -o trace.json [--device]
                                      a Chrome/Perfetto trace of a running program
    tpu-info doctor                   why each N/A, and what to do
    tpu-info run -- python train.py   start a program with the hook installed
    tpu-info exporter [--listen H:P]  one Prometheus endpoint: this host's chips and processes

Exit codes: 0 all good; 1 some targets failed (what could be read is still
printed); 2 usage error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tpu_info import __version__
from tpu_info.commands import exporter_cli
from tpu_info.net.targets import shown

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2. Control characters in the
    message (the user's own argument, echoed) are escaped."""

    def __init__(self, message: str) -> None:
        super().__init__(shown(message))


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


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


def _pid(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 1 << 31:
        raise UsageError(f"--pid must be a process id (a positive integer), got {text!r}")
    return int(text)


def _output_file(text: str) -> str:
    if not text or "\0" in text:
        raise UsageError(f"-o must name a file, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="tpu-info", description="See what your accelerators and the XLA "
                "programs on them are doing.", epilog="Exit codes: 0 all good; 1 some "
                "targets failed; 2 usage error.")
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    p.add_argument("-p", "--process", action="store_true",
                   help="show only the processes table (Google's flag)")
    p.add_argument("--streaming", action="store_true", help="refresh in place (Ctrl-C stops)")
    p.add_argument("--watch", action="store_true",
                   help="live dashboard (q quits, ? lists keys); --rate sets its interval")
    p.add_argument("--rate", type=seconds_arg("--rate", 0.1), default=1.0, metavar="S",
                   help="seconds between refreshes with --streaming (default 1, floor 0.1)")
    p.add_argument("--list_metrics", action="store_true", help="list metric names and exit")
    p.add_argument("--metric", action=_MetricAction, dest="metric_name", metavar="NAME",
                   help="show one metric (repeatable); Google's short names or ours")
    p.add_argument("-f", "--filter", action=_FilterAction, metavar="'percentile:[p50,p90]'",
                   help="percentile columns for the --metric before it")
    p.add_argument("--json", action="store_true", help="print the tpu-info/v1 JSON document")
    p.add_argument("--target", action="append", type=target_arg, default=[], metavar="HOST:PORT",
                   help="also read this hook or libtpu (repeatable)")
    p.add_argument("--targets-file", metavar="FILE", help="HOST:PORT per line (# comments)")
    p.add_argument("--no-discovery", action="store_true",
                   help="read only --target's, not this host's hooked processes and libtpu")
    p.add_argument("--timeout", type=seconds_arg("--timeout"), default=3.0, metavar="S",
                   help="seconds the whole command may take, replies included (default 3)")
    p.add_argument("--no-color", action="store_true", help="plain text, no colours")
    sub = p.add_subparsers(dest="command", metavar="{report,profile,doctor,run,exporter}")
    r = sub.add_parser("report", help="a running program's metrics_report()")
    who = r.add_mutually_exclusive_group()
    who.add_argument("--pid", type=_pid, help="the hooked process with this pid")
    who.add_argument("--target", dest="report_target", type=target_arg, metavar="HOST:PORT")
    r.add_argument("--short", action="store_true", help="short_metrics_report()")
    pr = sub.add_parser("profile", help="capture a Chrome/Perfetto trace of a running program")
    who = pr.add_mutually_exclusive_group()
    who.add_argument("--pid", type=_pid, help="the hooked process with this pid")
    who.add_argument("--target", dest="report_target", type=target_arg, metavar="HOST:PORT")
    pr.add_argument("--duration", type=_capture_seconds, default=5.0, metavar="S",
                    help="seconds to record (default 5, at most 300)")
    pr.add_argument("-o", "--output", required=True, type=_output_file, metavar="FILE",
                    help="trace file to write (gzip-compressed if it ends in .gz)")
    pr.add_argument("--device", action="store_true",
                    help="also jax.profiler / torch.profiler traces (the program opts in), "
                         "beside FILE as <name>.device-N.*")
    sub.add_parser("doctor", help="explain every N/A and what to do")
    run = sub.add_parser("run", help="run a Python program with the hook installed")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- python train.py ...")
    exporter_cli.add_parser(sub, seconds_arg, UsageError)
    p.set_defaults(metrics=[])
    return p


def _console(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(no_color=args.no_color, highlight=False, emoji=False, markup=False,
                   soft_wrap=False)


def _targets(args: argparse.Namespace) -> list[str]:
    from tpu_info.net.targets import read_targets_file

    targets = list(args.target)
    if args.targets_file:
        try:
            targets += read_targets_file(args.targets_file)
        except ValueError as e:
            raise UsageError(str(e)) from e
    return targets


def _left(args: argparse.Namespace) -> float:
    """Seconds left of the command's ``--timeout`` (its whole wall time)."""
    return max(0.01, args.deadline - time.monotonic())


def _say(message: object) -> None:
    """One error line on stderr; what a server said is cleaned once more here."""
    from tpu_info.contract.safe import clean

    print(f"tpu-info: {clean(message, 1000)}", file=sys.stderr)


def _gather(args: argparse.Namespace, targets: list[str]):  # type: ignore[no-untyped-def]
    from tpu_info.commands.gather import gather

    return gather(targets, timeout=_left(args), use_discovery=not args.no_discovery,
                  probe_libtpu=not args.no_discovery, scan_devices=not args.no_discovery)


def _renderable(args: argparse.Namespace, g: Any, width: int) -> Any:
    from rich.console import Group

    from tpu_info.host import devices
    from tpu_info.outputs import render
    from tpu_info.views.metrics import DEFAULT_PERCENTILES, metric_table
    from tpu_info.views.values import Header

    if args.metrics:
        return Group(*(metric_table(name, g.views, cols or DEFAULT_PERCENTILES)
                       for name, cols in args.metrics))
    header = Header.now(accelerator_type=devices.accelerator_type(g.local))
    if args.process:
        return render.processes_table(g.views, render.Reasons(), width)
    return render.render(g.views, local=g.local, header=header, width=width)


def _watch(args: argparse.Namespace, targets: list[str]) -> int:
    """Hands this process over to the dashboard (``python -m tui``): the CLI
    never imports ``tui`` (layering: ``tui -> tpu_info``, not back)."""
    import importlib.util
    import os

    if importlib.util.find_spec("tui") is None:
        print("tpu-info: the dashboard (package 'tui') is not installed", file=sys.stderr)
        return EXIT_USAGE
    argv = [sys.executable, "-m", "tui", "--rate", str(args.rate),
            "--timeout", str(args.timeout)]
    for t in targets:
        argv += ["--target", t]
    if args.no_discovery:
        argv.append("--no-discovery")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return EXIT_OK  # not reached


def _show(args: argparse.Namespace, targets: list[str]) -> int:
    from tpu_info.views.metrics import unknown_metric

    console = _console(args)
    if args.streaming:
        import time

        from rich.live import Live

        try:
            with Live(console=console, auto_refresh=False, screen=False) as live:
                while True:
                    args.deadline = time.monotonic() + args.timeout
                    g = _gather(args, targets)
                    live.update(_renderable(args, g, console.width), refresh=True)
                    time.sleep(args.rate)
        except KeyboardInterrupt:
            return EXIT_OK
    g = _gather(args, targets)
    if bad := unknown_metric([name for name, _ in args.metrics or ()], g.views):
        raise UsageError(bad)
    if args.json:
        from tpu_info.outputs.jsonview import dumps, to_json

        doc = to_json(g.views, local=g.local)
        doc["notes"] = [{"where": w, "reason": r} for w, r in g.notes]
        print(dumps(doc))
    else:
        if not g.views and not g.local.chips and not args.metrics:
            console.print("No accelerator and no hooked process found. Run `tpu-info doctor` "
                          "to see why, or start a program with `tpu-info run -- python ...`.")
        else:
            console.print(_renderable(args, g, console.width))
    for v in g.failed:
        _say(v.error if v.error.startswith(f"{v.target}: ") else f"{v.target}: {v.error}")
    return EXIT_PARTIAL if g.failed else EXIT_OK


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
    from tpu_info.contract.errors import TpuInfoError
    from tpu_info.net.client import Client
    from tpu_info.outputs import textreport

    target = _pick_target(args)
    try:
        with Client(target, timeout=_left(args), deadline=args.deadline) as c:
            snap = c.snapshot()
    except TpuInfoError as e:
        _say(e)
        return EXIT_PARTIAL
    text = (textreport.short_metrics_report(snap) if args.short
            else textreport.metrics_report(snap))
    sys.stdout.write(text or "(the process has recorded nothing yet)\n")
    return EXIT_OK


def _capture_seconds(text: str) -> float:
    value = seconds_arg("--duration")(text)
    if value > 300:
        raise UsageError(f"--duration is at most 300 seconds (5 minutes), got {text!r}")
    return value


MAX_PROFILE_FILES = 64  # device files written at most (tpu_info.net.client takes no more)
# Suffixes a device file keeps (so viewers recognise it); any other becomes .bin.
_DEVICE_SUFFIXES = (".xplane.pb", ".trace.json.gz", ".json.gz", ".json", ".pb")


def _trace_stem(out: Any) -> str:
    name = out.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "trace"


def device_file_path(out: Any, index: int, server_name: str) -> Any:
    """Where ``tpu-info profile -o OUT`` writes the ``index``-th device file:
    beside OUT, named from OUT (``run.json`` -> ``run.device-0.xplane.pb``),
    never from the server's name (only a known suffix is kept from it)."""
    suffix = next((s for s in _DEVICE_SUFFIXES if server_name.endswith(s)), ".bin")
    return out.with_name(f"{_trace_stem(out)}.device-{index}{suffix}")


def _profile(args: argparse.Namespace) -> int:
    import gzip
    from pathlib import Path

    from tpu_info.contract.errors import TpuInfoError
    from tpu_info.net import discovery
    from tpu_info.net.client import Client
    from tpu_info.views.values import clean

    out = Path(args.output)
    try:
        is_dir = out.is_dir()
    except OSError as e:
        raise UsageError(f"-o {clean(args.output)}: {e.strerror or e}") from None
    if is_dir:
        raise UsageError(f"-o {clean(args.output)} is a directory; name the trace file")
    target = _pick_target(args)
    # A --pid names the record; otherwise the client finds it by port.
    secret = (discovery.secret_for(target, pid=args.pid) if args.pid is not None else None)
    print(f"tpu-info: recording {args.duration:g}s of {target} ...", file=sys.stderr)
    try:
        with Client(target, timeout=args.timeout) as c:
            cap = c.capture_files(args.duration, device=args.device, secret=secret)
    except TpuInfoError as e:
        print(f"tpu-info: {clean(e)}", file=sys.stderr)
        return EXIT_PARTIAL
    sent = [f for f in cap.files if f.data is not None][:MAX_PROFILE_FILES]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(gzip.compress(cap.trace, mtime=0) if out.name.endswith(".gz")
                        else cap.trace)
        written = []
        for i, f in enumerate(sent):
            path = device_file_path(out, i, f.name)
            path.write_bytes(f.data or b"")
            written.append((path, f.name))
    except OSError as e:
        print(f"tpu-info: cannot write the trace: {clean(e)}", file=sys.stderr)
        return EXIT_PARTIAL
    print(f"wrote {clean(out)} ({cap.event_count} events"
          f"{', truncated' if cap.truncated else ''}); "
          "open it in https://ui.perfetto.dev or chrome://tracing")
    for path, name in written:
        print(f"device trace: {clean(path)} ({clean(name)})")
    kept = [f for f in cap.files if f.data is None]
    for f in kept[:MAX_PROFILE_FILES]:
        print(f"device trace (left on {clean(target)}'s host): {clean(f.server_path)}")
    if len(kept) > MAX_PROFILE_FILES:
        print(f"note: {len(kept) - MAX_PROFILE_FILES} more device trace(s) left on that host")
    for note in cap.notes:
        print(f"note: {clean(note)}")
    return EXIT_OK


def _doctor(args: argparse.Namespace, targets: list[str]) -> int:
    from tpu_info.contract.safe import clean
    from tpu_info.outputs import render

    g = _gather(args, targets)
    lines = [f"{w}: {r}" for w, r in g.notes]
    lines += [f"{v.target}: {v.error}" for v in g.failed]
    lines += [f"{w}: {r}" for w, r in render.reasons(g.views, local=g.local)]
    lines += render.hooked_lines(g.views)
    lines += render.blind_spot_lines(g.views)
    print(f"tpu-info doctor: {len(g.views)} target(s) read, {g.discovered} discovered, "
          f"{len(g.local.chips)} local accelerator(s)")
    for line in dict.fromkeys(clean(line, 1000) for line in lines):
        print(f"  - {line}")
    if not lines:
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
        return run_hooked(argv)
    except HookNotFoundError as e:
        print(f"tpu-info: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FileNotFoundError:
        raise UsageError(f"command not found: {argv[0]}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` and runs the command; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        args.deadline = time.monotonic() + args.timeout  # --timeout is the whole command's
        if args.version:
            print(f"tpu-info {__version__}")
            return EXIT_OK
        if args.list_metrics:
            from tpu_info.views.metrics import list_metrics_table

            _console(args).print(list_metrics_table())
            return EXIT_OK
        if args.command == "run":
            return _run(args)
        if args.command == "exporter":
            return exporter_cli.run(args, UsageError)
        if args.command == "report":
            return _report(args)
        if args.command == "profile":
            return _profile(args)
        targets = _targets(args)
        if args.command == "doctor":
            return _doctor(args, targets)
        if args.watch:
            return _watch(args, targets)
        return _show(args, targets)
    except UsageError as e:
        print(f"tpu-info: {e} (see 'tpu-info --help')", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        return EXIT_OK


def run() -> None:
    """Console-script entry point."""
    raise SystemExit(main())


if __name__ == "__main__":
    run()
