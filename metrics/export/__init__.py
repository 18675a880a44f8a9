"""Serve the hook's snapshots over gRPC: :func:`start` returns an :class:`Exporter`.

Port rule: an explicit ``port``, else ``$TPU_INFO_PORT``, else 8431 when it
is free and this is no TPU host (libtpu's port, so Google's ``tpu-info``
finds the hook on machines without libtpu), else a free ephemeral port; on a
host with TPU chips or libtpu installed, none of libtpu's ports (8431,
``$TPU_RUNTIME_METRICS_PORTS``) is taken unless pinned
(:mod:`tpu_info.contract.libtpu_ports`). Binding is loopback-only unless
``bind=`` or ``$TPU_INFO_BIND`` names other addresses (one warning; see
:mod:`metrics.export.binding`: ``0.0.0.0`` is IPv4 only, the Prometheus
endpoint has its own setting, and captures stay loopback-only). The server
also listens on its 0600 local socket, and on that socket alone where no TCP
socket can be opened (one warning; nothing of grpc's) or when
``$TPU_INFO_BIND`` is ``unix``: its discovery record then has port 0.
At interpreter exit the exporter removes its discovery record first and
then stops serving without waiting for anything (calls in flight are cut,
the serving helper leaves on its own), so a hooked program stops as fast as
without the hook (``bench/exit_latency.py``). Served by a helper (the
default), the program gets no SIGTERM handler at all: SIGTERM kills it at
once, as without the hook, and the helper, seeing the program gone, removes
the record. Served in-process, a SIGTERM handler removes the record, stops
serving without waiting, and then runs the previous handler or dies by the
signal. A forked child owns none of it: its
exit and its SIGTERM do what they would without the hook, and it closes its
copies of the server's sockets (see :mod:`metrics.recording.forksafe`).

Example:
    >>> import metrics
    >>> from metrics import export
    >>> exporter = export.start(metrics.snapshot, port=0)
    >>> exporter.address.startswith("127.0.0.1:")
    True
    >>> exporter.stop()
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from metrics import config
from metrics.export import binding, discovery, port_claim, saving
from metrics.export.binding import BindError
from metrics.export.captures import CaptureFn, register_capture
from metrics.recording import forksafe
from tpu_info.contract import discovery_record as _record
from tpu_info.contract import libtpu_ports

if TYPE_CHECKING:  # the server (and grpc) loads in start(): `import profiler` stays light
    from metrics.export.captures import SnapshotFn
    from metrics.export.server import Server

__all__ = ["start", "Exporter", "BindError", "LIBTPU_PORT", "LOOPBACK", "register_capture"]

log = logging.getLogger("metrics.export")

LIBTPU_PORT = libtpu_ports.LIBTPU_PORT
LOOPBACK = binding.LOOPBACK


def _env_port() -> int | None:
    return config.port(config.PORT)


def _port_free(address: str, port: int) -> bool:
    """Whether ``port`` can be bound on every address of the setting ``address``
    right now (a plain socket probe, so a busy 8431 falls back quietly instead
    of gRPC logging an error)."""
    for a in binding.addresses(address):
        host = a.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, port))
        except OSError:
            return False
    return True


class Exporter:
    """A running server; stop it with :meth:`stop` (also done at exit)."""

    def __init__(self, server: Server, host: str, published: Any = None) -> None:
        self._server = server
        self.host = host  # "": served on the local socket alone
        self.port = server.port
        self.local_socket: str = getattr(server, "local_socket", "") or ""
        self._no_tcp: tuple[str, str] = ("", "")  # why no TCP, the OS's words
        self.address = self._address(server.port)
        self.published = published
        # engine, versions, waiting
        self._record: tuple[str, dict[str, str], list[str]] = ("", {}, [])
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._prev_sigterm: Any = None
        self._sigterm_installed = False
        self._sigterm_handler: Any = None
        self._owner = forksafe.owned(self)  # a forked child owns none of it
        # A serving helper removes the record when this process is gone, so
        # SIGTERM needs no Python handler here (see metrics.export.helper).
        self._sigterm_cleanup = not getattr(server, "removes_record_at_death", False)

    def _address(self, port: int) -> str:
        if not port:  # the local socket alone
            return f"unix:{self.local_socket}"
        return f"{self.host}:{port}" if ":" not in self.host else f"[{self.host}]:{port}"

    def _publish(self, engine: str, versions: dict[str, str],
                 waiting: list[str] | None = None) -> None:
        self._record = (engine, versions, list(waiting or []))
        self.published = _publish(self.port, self.host, *self._record,
                                  sigterm=self._sigterm_cleanup, no_tcp=self._no_tcp)
        if hasattr(self._server, "on_port_change"):  # a serving helper that may restart
            self._server.on_port_change = self._serving_moved

    def republish(self, engine: str, versions: dict[str, str], waiting: list[str]) -> None:
        """Rewrites the discovery record when the hooked or awaited engines
        changed (an engine hooked after its late import); nothing when stopped,
        in a forked child, or when nothing changed."""
        with self._stop_lock:
            if self._stopped or os.getpid() != self._owner:
                return
            if self._record == (engine, versions, list(waiting)):
                return
            self._record = (engine, dict(versions), list(waiting))
            if self.published is not None:  # else: written when serving again
                self.published = _publish(self.port, self.host, *self._record,
                                          sigterm=self._sigterm_cleanup, no_tcp=self._no_tcp)

    def _serving_moved(self, port: int | None) -> None:
        """The server stopped serving (``None``: its record goes at once) or
        serves again on ``port`` (the record names it). Off the training thread."""
        with self._stop_lock:
            if self._stopped or os.getpid() != self._owner:
                return
            if port is None:
                _unpublish()
                self.published = None
                return
            self.port = port
            self.address = self._address(port)
            self.published = _publish(port, self.host, *self._record,
                                      sigterm=self._sigterm_cleanup, no_tcp=self._no_tcp)

    def let_go_after_fork(self) -> None:
        """In a fork child: closes the copies of the server's sockets."""
        if not self._stopped:  # a stopped one's port may be someone else's now
            forksafe.close_sockets_on_port(self.port)

    def stop(self, grace: float | None = 1.0) -> None:
        """Unpublishes discovery, ends streams and stops serving, waiting up
        to ``grace`` for calls in flight. Idempotent; nothing in a forked
        child (the parent's server is not the child's)."""
        if self._claim_stop():
            self._server.stop(grace)

    def _halt(self) -> None:
        """The stop of an ending program (interpreter exit, SIGTERM): the
        record goes first, then the server is told to stop and nothing is
        waited for (no grace, no join, no helper's exit), so stopping takes
        as long as without the hook. Idempotent; nothing in a forked child."""
        if self._claim_stop():
            self._server.halt()

    def _claim_stop(self) -> bool:
        """Whether this call stops the exporter (the first, in its owner);
        if so the record is gone and the exit hooks are off when it returns."""
        if os.getpid() != self._owner:
            return False
        with self._stop_lock:
            if self._stopped:
                return False
            self._stopped = True
        _unpublish()  # first: a stop cut short by the process's end still removed it
        atexit.unregister(self._at_exit)
        self._restore_sigterm()
        return True

    @property
    def stopped(self) -> bool:
        """Stopped, or inherited by a forked child (which it does not serve)."""
        return self._stopped or os.getpid() != self._owner

    def _at_exit(self) -> None:
        self._halt()

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        self._prev_sigterm = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            self._on_sigterm(signum, frame)

        setattr(on_sigterm, forksafe.PREVIOUS, self._prev_sigterm)
        self._sigterm_handler = on_sigterm
        signal.signal(signal.SIGTERM, on_sigterm)
        self._sigterm_installed = True

    def _restore_sigterm(self) -> None:
        if not self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        self._sigterm_installed = False
        if signal.getsignal(signal.SIGTERM) is self._sigterm_handler:
            signal.signal(signal.SIGTERM, self._prev_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._halt()  # nothing in a forked child
        saving.on_sigterm()  # the run, as it ended (waited for 1 s at most)
        # Then what SIGTERM would have done without us.
        forksafe.act_as(self._prev_sigterm, signum, frame)


def _stop_before_thread_pools(exporter: Exporter) -> None:
    """Stops the server before interpreter shutdown joins thread pools.

    ``concurrent.futures`` shuts its pools down (and joins their threads) in a
    ``threading`` exit hook, which runs *before* ``atexit`` handlers: a server
    still serving then would fail to schedule calls, and open streams would
    keep the program from exiting. ``threading._register_atexit`` hooks run in
    reverse order of registration, so ours runs before the pools' hook. It is
    private: without it, ``atexit`` still stops the server (later).
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    try:
        register(exporter._at_exit)
    except RuntimeError:  # already shutting down
        pass


def _publish(port: int, host: str, engine: str, versions: dict[str, str],
             waiting: list[str] | None = None, *, sigterm: bool = True,
             no_tcp: tuple[str, str] = ("", "")) -> Any:
    try:
        return discovery.publish(port, host, engine, versions, waiting=waiting or (),
                                 sigterm=sigterm, no_tcp=no_tcp)
    except Exception as e:  # noqa: BLE001 - discovery is best effort; serving goes on
        log.warning("tpu-info: could not publish the discovery record: %r", e)
        return None


def _unpublish() -> None:
    try:
        discovery.unpublish()
    except Exception as e:  # noqa: BLE001 - best effort at shutdown
        log.debug("tpu-info: could not remove the discovery record: %r", e)


def start(
    snapshot_fn: SnapshotFn,
    *,
    port: int | None = None,
    bind: str | None = None,
    engine: str = "",
    versions: dict[str, str] | None = None,
    workers: int | None = None,
    server_factory: Callable[..., Server] | None = None,
    capture_fn: CaptureFn | None = None,
) -> Exporter:
    """Starts serving ``snapshot_fn``'s snapshots and returns the exporter.

    Args:
        snapshot_fn: ``snapshot_fn(events_since) -> Snapshot``; runs on the
            server's threads at request time, never on the caller's.
        port: pin a port (0: any free one). Default: ``$TPU_INFO_PORT``, else
            8431 if free and no libtpu may want it, else any free port.
        bind: where to listen: an address or a comma-separated list
            (``0.0.0.0``: every IPv4 address; ``unix``: the local socket
            alone). Default: ``$TPU_INFO_BIND``, else loopback.
        engine: engine names for the discovery record (for example ``"jax"``).
        versions: versions for the discovery record.
        workers: most server threads (default 40, started on demand; each
            open stream holds one).
        server_factory: builds the :class:`~metrics.export.server.Server`
            (default; the serving helper and tests inject another).
        capture_fn: runs ``Monitor.Capture`` calls (default: none, answered
            UNIMPLEMENTED); see :data:`metrics.export.server.CaptureFn`.

    Raises:
        BindError: a pinned port (argument or ``$TPU_INFO_PORT``) is taken, or
            neither TCP nor the local socket can be had. The discovery record
            then says that the server failed (``failed``), for ``doctor``.
        ValueError: ``$TPU_INFO_PORT`` is not a port number.

    Example:
        >>> exporter = start(lambda since: None, port=0)  # doctest: +SKIP
    """
    if server_factory is None:
        from metrics.export.server import Server

        server_factory = Server
    address = binding.setting(bind, binding.GRPC_ENV)
    kwargs: dict[str, Any] = {"address": address}
    if workers is not None:
        kwargs["workers"] = workers
    if capture_fn is not None:
        kwargs["capture_fn"] = capture_fn
    local = discovery.socket_path()  # the owner's way in, whoever holds the TCP port
    if local is not None:
        kwargs["local_socket"] = local
    pinned = port if port is not None else _env_port()
    try:
        no_tcp = _no_tcp(address, pinned, local)
        if no_tcp is None:
            binding.warn_once("the gRPC server", address, "read this program's metrics "
                              "(captures stay loopback-only, for its owner)")
        server = _bind(server_factory, snapshot_fn, address, pinned, no_tcp, kwargs)
        server.start()
    except Exception as e:
        # Its record says so (doctor reads it), and the error goes to install().
        discovery.publish_failure(str(e) or type(e).__name__, engine, dict(versions or {}))
        raise
    host = "" if no_tcp is not None else binding.dial_host(address)
    exporter = Exporter(server, host)
    exporter._no_tcp = no_tcp or ("", "")
    exporter._publish(engine, dict(versions or {}))
    atexit.register(exporter._at_exit)
    _stop_before_thread_pools(exporter)
    if exporter._sigterm_cleanup:
        exporter._install_sigterm()
    return exporter


def _no_tcp(address: str, pinned: int | None, local: str | None) -> tuple[str, str] | None:
    """``(why, the OS's words)`` when the server listens on its local socket
    alone (:data:`~tpu_info.contract.discovery_record.NO_TCP_REASONS`), else
    None. Says so in one line (INFO when asked for, else a warning).

    Raises:
        BindError: no TCP socket can be opened here, and there is no local socket.
    """
    if binding.unix_only(address):
        log.info("tpu-info: serving on the local socket %s only (%s=%s)", local,
                 binding.GRPC_ENV, address)
        return (_record.NO_TCP_ASKED, "")
    why = binding.no_tcp(address)
    if why is None:
        return None
    if local is None:
        raise BindError(f"cannot serve: {why}, and there is no local socket (see the "
                        "warning above; set TPU_INFO_RUNTIME_DIR to a private directory)")
    pinned_too = f"; port {pinned} is not served" if pinned else ""
    log.warning("tpu-info: serving on the local socket %s only: %s%s (tpu-info on this "
                "host reads it)", local, why, pinned_too)
    return (_record.NO_TCP_UNAVAILABLE, why)


def _bind(server_factory: Callable[..., Server], snapshot_fn: SnapshotFn, address: str,
          pinned: int | None, no_tcp: tuple[str, str] | None, kwargs: dict[str, Any]) -> Server:
    """A bound server: the local socket alone, the pinned port, else 8431
    when that is ours to take (:func:`_default_port`), else an ephemeral port
    that is none of libtpu's."""
    if no_tcp is not None:
        return _bound(server_factory(snapshot_fn, port=None, **kwargs))
    if pinned is not None:  # the user's choice, libtpu's port or not
        return _bound(server_factory(snapshot_fn, port=pinned, **kwargs))
    reserved = _libtpu_reserved()
    if LIBTPU_PORT not in reserved:
        with port_claim.claimed(LIBTPU_PORT) as mine:  # this user's programs take turns
            if mine and _port_free(address, LIBTPU_PORT):
                try:
                    return _bound(server_factory(snapshot_fn, port=LIBTPU_PORT, **kwargs))
                except BindError:  # another user's program took it between the two
                    pass
    for _ in range(4):  # the kernel's ephemeral range rarely holds libtpu's ports
        server = _bound(server_factory(snapshot_fn, port=0, **kwargs))
        if server.port not in reserved:
            return server
        server.stop(grace=0)
    raise BindError(f"every ephemeral port given was one of libtpu's ({sorted(reserved)})")


def _bound(server: Server) -> Server:
    try:
        server.bind()
    except BaseException:
        server.stop(grace=0)
        raise
    return server


def _libtpu_reserved(sysfs_root: str = "/sys") -> frozenset[int]:
    """The ports the hook must not take: libtpu's (8431 and
    ``$TPU_RUNTIME_METRICS_PORTS``) on a host with TPU chips or libtpu
    installed, where libtpu's own service is the truth; none elsewhere."""
    if not libtpu_ports.tpu_host(sysfs_root):
        return frozenset()
    return frozenset(libtpu_ports.libtpu_ports())
