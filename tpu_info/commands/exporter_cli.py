"""``tpu-info exporter``'s flags and its run loop (the logic is
:mod:`tpu_info.commands.exporter`, imported only when the command runs, so
``tpu-info``'s start-up never loads prometheus_client).

    tpu-info exporter                                  127.0.0.1:9431, this user's processes
    tpu-info exporter --listen 0.0.0.0:9431 --job llama --sd-file /shared/sd/$(hostname).json
    tpu-info exporter --listen 0.0.0.0:9431 --web.config.file /etc/tpu-info/web.yml
    tpu-info exporter --node-name "$NODE_NAME"         a Kubernetes node: pod labels per process

Exit codes: 0 stopped by Ctrl-C or SIGTERM; 1 the address cannot be bound
or the service-discovery file cannot be written; 2 usage error (a web
configuration file that cannot be used included).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_LISTEN = "127.0.0.1:9431"


def listen_arg(error: Callable[[str], Exception]) -> Callable[[str], tuple[str, int]]:
    """An argparse ``type`` for ``--listen HOST:PORT`` (port 0: any free one)."""
    from tpu_info.net.targets import validate_target

    def parse(text: str) -> tuple[str, int]:
        host, sep, port = text.strip().rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
            raise error(f"--listen must be HOST:PORT (port 0..65535), got {text!r}")
        try:
            validate_target(f"{host}:1")
        except ValueError as e:
            raise error(f"--listen: {str(e).replace(':1', '')}") from None
        return host.strip("[]"), int(port)

    return parse


def add_parser(sub: Any, seconds: Callable[..., Callable[[str], float]],
               error: Callable[[str], Exception]) -> None:
    """Adds ``exporter`` to ``sub`` (``seconds`` and ``error`` are the CLI's
    ``seconds_arg`` and ``UsageError``: injected, so this module imports
    nothing of the CLI's)."""
    e = sub.add_parser(
        "exporter", help="one Prometheus endpoint for this host: its chips and every "
        "hooked process", description="Serves this host's chips and every hooked process "
        "of this user (found through the discovery records) as one Prometheus endpoint.")
    e.add_argument("--listen", type=listen_arg(error), default=listen_arg(error)(DEFAULT_LISTEN),
                   metavar="HOST:PORT", help=f"where to serve /metrics (default {DEFAULT_LISTEN}; "
                   "an address beyond loopback, e.g. 0.0.0.0:9431, opens it to the network)")
    e.add_argument("--runtime-dir", metavar="DIR", help="discovery records to read (default "
                   "$TPU_INFO_RUNTIME_DIR, else $XDG_RUNTIME_DIR/tpu-info, else "
                   "/tmp/tpu-info-<uid>)")
    e.add_argument("--host-label", metavar="NAME", help="the host label on every series "
                   "(default: this host's name)")
    e.add_argument("--job", metavar="NAME", help="a job label on every series (keep it with "
                   "honor_labels: true in the scrape config)")
    e.add_argument("--interval", type=seconds("--interval", 0.1), default=5.0, metavar="S",
                   help="seconds between polls of the host and its processes (default 5)")
    e.add_argument("--timeout", dest="poll_timeout", type=seconds("--timeout", 0.05),
                   default=None, metavar="S", help="seconds a poll waits for its targets, all "
                   "asked at once (default 2, or --interval when shorter; at most --interval)")
    e.add_argument("--no-libtpu", action="store_true",
                   help="never ask libtpu on localhost:8431 for its chips")
    e.add_argument("--sysfs", default="/sys", metavar="DIR",
                   help="where the host's /sys is (a container's mount; default /sys)")
    e.add_argument("--procfs", default="/proc", metavar="DIR",
                   help="where the host's /proc is (default /proc)")
    e.add_argument("--sd-file", type=Path, metavar="FILE", help="write Prometheus file_sd "
                   "JSON naming this exporter (removed at exit)")
    e.add_argument("--sd-address", metavar="HOST:PORT", help="the address --sd-file names "
                   "(default: the --listen address, this host's name for 0.0.0.0 or ::)")
    e.add_argument("--kubernetes", choices=("auto", "off"), default="auto",
                   help="auto (default): a process in a Kubernetes pod gets namespace, pod, "
                   "container and node labels (its cgroup, then the kubelet's pod-resources "
                   "socket, else the API server with the pod's service account); off: never")
    e.add_argument("--node-name", metavar="NAME", help="this node's name: the node label, and "
                   "the node whose pods the API server is asked for (default $NODE_NAME)")
    e.add_argument("--kubelet-socket", metavar="PATH", default=None,
                   help="the kubelet's pod-resources socket (default "
                   "/var/lib/kubelet/pod-resources/kubelet.sock; '' never asks it)")
    e.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                   help="Prometheus' web configuration file (exporter-toolkit's YAML: "
                   "tls_server_config for HTTPS and client certificates, basic_auth_users "
                   "with bcrypt hashes), as node_exporter's")


def _sd_address(args: argparse.Namespace, port: int) -> str:
    import socket

    if args.sd_address:
        return str(args.sd_address)
    host = args.listen[0]
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run(args: argparse.Namespace, error: Callable[[str], Exception]) -> int:
    """Serves until Ctrl-C or SIGTERM; returns the exit code."""
    import threading

    from tpu_info.commands import exporter as ex
    from tpu_info.commands.gather import libtpu_targets
    from tpu_info.contract.safe import clean
    from tpu_info.host.devices import scan_local
    from tpu_info.net import webconfig
    from tpu_info.net.targets import is_loopback_host

    if args.poll_timeout is None:  # not given: the default, never past the interval
        args.poll_timeout = min(2.0, args.interval)
    if args.poll_timeout > args.interval:
        raise error(f"--timeout ({args.poll_timeout:g}s) must be at most --interval "
                    f"({args.interval:g}s)")
    for flag, value in (("--host-label", args.host_label), ("--job", args.job),
                        ("--node-name", args.node_name)):
        if value is not None and (not value.strip() or not value.isprintable()):
            raise error(f"{flag} must be printable text, got {value!r}")
    web = None
    if args.web_config_file:
        try:
            web = webconfig.load(args.web_config_file)
        except webconfig.WebConfigError as e:
            raise error(f"--web.config.file: {clean(str(e))}") from None
    pods = {"kubernetes": args.kubernetes != "off",
            **({"node_name": args.node_name} if args.node_name else {}),
            **({"kubelet_socket": args.kubelet_socket} if args.kubelet_socket is not None
               else {})}
    options = ex.ExporterOptions(
        **({"host_label": args.host_label} if args.host_label else {}), job=args.job,
        runtime_dir=args.runtime_dir, interval_s=args.interval, timeout_s=args.poll_timeout,
        libtpu_target=None if args.no_libtpu else libtpu_targets(), **pods)
    exporter = ex.HostExporter(
        options, scan_chips=lambda: scan_local(args.sysfs, args.procfs), proc_root=args.procfs)
    host, port = args.listen
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())  # before anyone learns the port
    try:
        port = exporter.start(host, port, web)
    except OSError as e:
        print(f"tpu-info: exporter cannot listen on {clean(host)}:{port}: "
              f"{clean(e.strerror or e)}", file=sys.stderr)
        return 1
    shown = f"[{host}]" if ":" in host else host
    if not is_loopback_host(host) and not (web and web.guarded):
        print(f"tpu-info: warning: the exporter listens on {clean(host)} (not loopback): "
              "anyone who can reach this host can read its metrics", file=sys.stderr)
    try:
        if args.sd_file:
            ex.write_sd_file(args.sd_file, _sd_address(args, port), options.labels)
    except OSError as e:
        exporter.stop()
        print(f"tpu-info: cannot write {clean(args.sd_file)}: {clean(e.strerror or e)}",
              file=sys.stderr)
        return 1
    scheme = web.scheme if web else "http"
    print(f"tpu-info exporter: serving {scheme}://{shown}:{port}/metrics (host "
          f"{clean(options.host_label)}, polling every {args.interval:g}s)",
          file=sys.stderr, flush=True)
    try:
        while not done.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        exporter.stop()
        if args.sd_file:
            args.sd_file.unlink(missing_ok=True)
    return 0
