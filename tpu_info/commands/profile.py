"""``tpu-info profile``: a Chrome/Perfetto trace of a running hooked program.

Every hooked program can be traced by its owner. One that loaded the
profiler answers with its whole trace (annotations included); any other
answers with the capture's window, and the host timeline is built here
from the hook's events read over that window
(:mod:`tpu_info.net.capture_events`, :mod:`tpu_info.outputs.host_timeline`).
Device traces (``--device``, when the program opted in) come back as files
written beside ``-o``, named from it, never from the server. Every file is
written whole or not at all (:mod:`tpu_info.commands.files`).

Exit codes: 0 written; 1 the capture or the target failed or was refused,
or the files could not be written; 2 usage errors (raised by the caller).
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

from tpu_info.contract.captures import WINDOW_FORMAT
from tpu_info.contract.errors import TpuInfoError
from tpu_info.views.values import clean

__all__ = ["profile", "device_file_path", "MAX_PROFILE_FILES"]

EXIT_OK = 0
EXIT_PARTIAL = 1
MAX_PROFILE_FILES = 64  # device files written at most (tpu_info.net.client takes no more)
# Suffixes a device file keeps (so viewers recognise it); any other becomes .bin.
_DEVICE_SUFFIXES = (".xplane.pb", ".trace.json.gz", ".json.gz", ".json", ".pb")


def _trace_stem(out: Path) -> str:
    name = out.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "trace"


def device_file_path(out: Path, index: int, server_name: str) -> Path:
    """Where ``tpu-info profile -o OUT`` writes the ``index``-th device file:
    beside OUT, named from OUT (``run.json`` -> ``run.device-0.xplane.pb``),
    never from the server's name (only a known suffix is kept from it)."""
    suffix = next((s for s in _DEVICE_SUFFIXES if server_name.endswith(s)), ".bin")
    return out.with_name(f"{_trace_stem(out)}.device-{index}{suffix}")


def profile(args: argparse.Namespace, target: str, out: Path) -> int:
    """Captures ``args.duration`` seconds of ``target`` into ``out``; the exit code."""
    from tpu_info.commands.files import write_all
    from tpu_info.net import discovery
    from tpu_info.net.capture_events import capture_with_events
    from tpu_info.outputs.host_timeline import fill

    # A --pid names the record; otherwise the client finds it by port.
    secret = (discovery.secret_for(target, pid=args.pid) if args.pid is not None else None)
    print(f"tpu-info: recording {args.duration:g}s of {target} ...", file=sys.stderr)
    try:
        cap, seen = capture_with_events(target, args.duration, device=args.device,
                                        secret=secret, timeout=args.timeout)
        if cap.format == WINDOW_FORMAT:
            cap = fill(cap, seen)
    except TpuInfoError as e:
        print(f"tpu-info: {clean(e)}", file=sys.stderr)
        return EXIT_PARTIAL
    sent = [f for f in cap.files if f.data is not None][:MAX_PROFILE_FILES]
    written = [(device_file_path(out, i, f.name), f.name) for i, f in enumerate(sent)]
    try:  # whole files or none: a full disk leaves no empty or cut trace behind
        out.parent.mkdir(parents=True, exist_ok=True)
        write_all([(out, gzip.compress(cap.trace, mtime=0) if out.name.endswith(".gz")
                    else cap.trace)] + [(p, f.data or b"") for (p, _), f in zip(written, sent)])
    except OSError as e:
        print(f"tpu-info: cannot write the trace to {clean(out)}: {clean(e.strerror or e)} "
              "(nothing written; free space or choose another -o)", file=sys.stderr)
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
