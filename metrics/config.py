"""Every ``TPU_INFO_*`` environment variable the hook reads: one place that
names each, its default, how it is parsed and what it means.

Callers read a variable through this module (:func:`port`, :func:`flag`,
:func:`text`, :func:`serve`), never ``os.environ`` with a literal name; the
table of variables in ``docs/environment.md`` lists :data:`VARIABLES` in this order
and with these meanings (``tests/metrics/test_config.py`` holds the two together). Three are
also named outside ``metrics``, where this module cannot be imported, and
the test checks they agree: ``TPU_INFO_RUNTIME_DIR`` (read by
``tpu_info.net.discovery``, shared with the CLI) and ``TPU_INFO_AUTOINSTALL``
(set by ``tpu_info.commands.run``, read by the ``tpu-info run`` bootstrap before
``metrics`` is imported).

This module imports only the standard library and ``tpu_info.net.discovery``'s
constant.

Example:
    >>> port(PORT, {"TPU_INFO_PORT": "9000"})
    9000
    >>> serve({"TPU_INFO_SERVE": "0"}), serve({})
    (False, 'process')
    >>> flag(DEVICE_CAPTURE, {"TPU_INFO_DEVICE_CAPTURE": "yes"})
    True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from tpu_info.contract.discovery_record import ENV_RUNTIME_DIR

__all__ = ["Variable", "VARIABLES", "PORT", "BIND", "PROMETHEUS_PORT", "PROMETHEUS_BIND",
           "PROMETHEUS_WEB_CONFIG",
           "SERVE", "DEVICE_CAPTURE", "RUNTIME_DIR", "AUTOINSTALL", "XLA_DEBUG_OWNER",
           "USER_PATHS", "SAVE", "SUMMARY",
           "text", "is_set", "flag", "port", "serve", "serve_word", "SERVE_WORDS",
           "docs_table"]

log = logging.getLogger("metrics.export")


@dataclass(frozen=True)
class Variable:
    """One environment variable.

    Attributes:
        name: the variable (``TPU_INFO_PORT``).
        default: what unset means, in words.
        meaning: one paragraph: what it does and how it is parsed (its row in
            ``docs/environment.md``).
        set_by_tpu_info: set by ``tpu-info`` itself for its child processes,
            not by users.
    """

    name: str
    default: str
    meaning: str
    set_by_tpu_info: bool = False


PORT = Variable(
    "TPU_INFO_PORT", "8431 when free and no TPU host, else any free port",
    "pin the gRPC port (`install(port=)`; `0`: any free port); 8431 by default so Google's "
    "client finds us on machines without libtpu. On a host with TPU chips or libtpu "
    "installed, libtpu's ports (8431, `TPU_RUNTIME_METRICS_PORTS`) are never taken unless "
    "pinned. A value that is not a port number in 0..65535 is an error, and so is a pinned "
    "port that is taken")
BIND = Variable(
    "TPU_INFO_BIND", "loopback",
    "serve gRPC on these addresses instead of loopback (comma-separated; `0.0.0.0` is every "
    "IPv4 address of the host, `::` every address of both families; one warning is logged; "
    "captures stay loopback-only, so keep loopback in the list to capture, e.g. "
    "`127.0.0.1,10.0.0.5`). `unix`: the program's local socket alone (`<pid>.sock` in the "
    "runtime directory, its user only), as where no TCP socket can be opened (gVisor, "
    "seccomp'd containers), which the hook finds by itself (one warning)")
PROMETHEUS_BIND = Variable(
    "TPU_INFO_PROMETHEUS_BIND", "loopback",
    "serve `/metrics` on this address instead of loopback (its own setting: `TPU_INFO_BIND` "
    "does not open it)")
DEVICE_CAPTURE = Variable(
    "TPU_INFO_DEVICE_CAPTURE", "off",
    "`1` (or `true`, `yes`) lets the owner's `tpu-info profile --device` run the device "
    "profilers (`install(device_capture=True)`)")
SERVE = Variable(
    "TPU_INFO_SERVE", "`process`",
    "where the gRPC server runs. `process`: a helper process beside the program "
    "(`install(serve=\"process\")`, see Serving). `thread` or `1`: a thread pool inside the "
    "program (`install(serve=\"thread\")` or `serve=True`); cheaper to start, but a flooding "
    "local client can then cost the program up to 90 % of its step rate (see the threat "
    "model). `0`: no server (`install(serve=False)`). Any other word is logged and the "
    "helper serves")
PROMETHEUS_PORT = Variable(
    "TPU_INFO_PROMETHEUS_PORT", "no endpoint",
    "also serve Prometheus `/metrics` on this port (`install(prometheus_port=)`); a port "
    "number in 0..65535")
PROMETHEUS_WEB_CONFIG = Variable(
    "TPU_INFO_PROMETHEUS_WEB_CONFIG", "unset (plain HTTP, no auth)",
    "a Prometheus web configuration file (exporter-toolkit's YAML: `tls_server_config`, "
    "`basic_auth_users`; as `tpu-info exporter --web.config.file`) for `/metrics`: HTTPS, "
    "client certificates, basic auth. A file that cannot be used leaves `/metrics` off "
    "with one warning; the program runs on")
RUNTIME_DIR = Variable(
    ENV_RUNTIME_DIR, "`$XDG_RUNTIME_DIR/tpu-info`, else `/tmp/tpu-info-<uid>`",
    "discovery directory, read by the hook and by `tpu-info` (mode 0700, files 0600)")
AUTOINSTALL = Variable(
    "TPU_INFO_AUTOINSTALL", "unset",
    "set by `tpu-info run`: the bootstrap loads the post-import hook "
    "(`metrics/engines/importwatch.py`, without importing `metrics`) and calls `metrics.install()` "
    "once the program imports jax, torch or torch_xla; engines imported after that are "
    "hooked by the same hook",
    set_by_tpu_info=True)
XLA_DEBUG_OWNER = Variable(
    "TPU_INFO_XLA_DEBUG_OWNER", "unset",
    "set by the torch_xla hook next to `PT_XLA_DEBUG_FILE`: the pid that owns that debug "
    "file, so a `torch_xla.launch` / `xmp.spawn` worker that inherits it makes its own and "
    "each process lists only the graphs it compiled",
    set_by_tpu_info=True)

USER_PATHS = Variable(
    "TPU_INFO_USER_PATHS", "unset",
    "directories (`os.pathsep`-separated) whose code is yours although installed. A "
    "finding's line is the first frame outside libraries (the standard library, the engine's "
    "and the hook's packages, and what the import system installed: files imported from "
    "site-packages, or from a directory where a distribution's `.dist-info` lists them, as "
    "`pip install --target` leaves them), decided once per file, with the library call it "
    "went through: `at "
    "train.py:41 (via flax nnx.jit)`; code under these paths counts as yours, so lines point "
    "into it")
SAVE = Variable(
    "TPU_INFO_SAVE", "`runs/` in the runtime directory",
    "where the run is saved when the program ends (a normal end, an exception, Ctrl-C; "
    "checkpointed while it runs, so SIGTERM and SIGKILL leave it too): a file, or an "
    "existing directory to write "
    "`<program>-<pid>-<start>.tpurun` into (`install(save=)`); `0`/`off` saves nothing. By "
    "default the newest 20 runs within 256 MB are kept. `tpu-info runs` lists them, "
    "`--from FILE` reads one")
SUMMARY = Variable(
    "TPU_INFO_SUMMARY", "off",
    "`1` (or `true`, `yes`) prints the end-of-run summary to stderr when the program ends, "
    "for programs that call `metrics.install()` themselves (`tpu-info run` prints it from "
    "outside, with `--summary`/`--no-summary`); formatting it costs the exit some "
    "milliseconds")

# In the order of docs/environment.md's table.
VARIABLES: tuple[Variable, ...] = (PORT, BIND, PROMETHEUS_BIND, DEVICE_CAPTURE, SERVE,
                                   PROMETHEUS_PORT, PROMETHEUS_WEB_CONFIG, RUNTIME_DIR,
                                   AUTOINSTALL, XLA_DEBUG_OWNER, USER_PATHS, SAVE,
                                   SUMMARY)


def docs_table() -> str:
    """The table of variables in ``docs/environment.md`` (``tests/metrics/test_config.py``
    finds it there verbatim)."""
    rows = ["| environment variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.default} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows)


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def text(var: Variable, environ: Mapping[str, str] | None = None) -> str:
    """The variable's value, stripped; ``""`` when unset."""
    return _env(environ).get(var.name, "").strip()


def is_set(var: Variable, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the variable holds anything but blanks."""
    return bool(text(var, environ))


def flag(var: Variable, environ: Mapping[str, str] | None = None) -> bool:
    """``1``, ``true`` or ``yes`` (any case) is on; anything else off."""
    return text(var, environ).lower() in ("1", "true", "yes")


def port(var: Variable, environ: Mapping[str, str] | None = None) -> int | None:
    """The port number the variable holds, None when unset.

    Raises:
        ValueError: not a port number in 0..65535 (one line naming the variable).
    """
    raw = text(var, environ)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{var.name} must be a port number, got {raw!r}") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"{var.name} must be in 0..65535, got {value}")
    return value


SERVE_WORDS: dict[str, bool | str] = {
    "": "process", "process": "process",
    # As install(serve=True): in the program, what "1" always meant.
    "thread": "thread", "1": "thread", "true": "thread", "yes": "thread",
    "0": False, "false": False, "no": False,
}


def serve_word(raw: str) -> bool | str:
    """A ``$TPU_INFO_SERVE`` value as ``install``'s ``serve``; an unknown word
    serves the default way (logged): the program must run on."""
    word = raw.strip().lower()
    if word not in SERVE_WORDS:
        log.warning("tpu-info: %s=%r is not one of process, thread, 1, 0; serving from "
                    "a helper process", SERVE.name, raw)
        return "process"
    return SERVE_WORDS[word]


def serve(environ: Mapping[str, str] | None = None) -> bool | str:
    """``$TPU_INFO_SERVE`` as ``install``'s ``serve`` (see :func:`serve_word`)."""
    return serve_word(_env(environ).get(SERVE.name, ""))
