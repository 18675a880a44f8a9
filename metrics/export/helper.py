"""Serving from a helper process: the same two services, with grpcio's
per-call work kept out of the watched program.

``metrics.install(serve="process")`` (or ``TPU_INFO_SERVE=process``) starts
``python -m metrics.export.helper_process`` next to the program (that
module is the helper's side, this one the program's). The helper binds the
port (same rules as in-process serving), runs the gRPC server and answers
every call from a mirror of the program's snapshot. The program keeps one
thread that sleeps in ``recv`` until the helper asks for a fresh snapshot:
at most one every ``helper_process.REFRESH_S`` (0.1 s) while clients are
asking, however many there are, each carrying only the events since the
previous one. So a program watched by hundreds of calls a second builds ten
snapshots a second, and the gRPC machinery (HTTP/2, threads, the GIL
hand-offs of every call) runs in the helper's interpreter, not the program's.

What the helper costs: one more process (~40 MB), about half a second to
start (``install`` waits for the port), and answers up to 0.1 s old.
``Capture`` calls are forwarded with the caller's token and address: the
program decides whether to record (:mod:`metrics.export.owner`) and
records the trace itself. The helper is handed the capture secret over the
private socketpair and refuses everyone else first, so a flood of refused
captures never reaches the program.
The helper exits when the program's end of the socket closes (exit, crash,
``kill -9``, SIGTERM), removing the program's discovery record first if the
program could not (it installs no SIGTERM handler: see :class:`HelperServer`),
and it is in its own session, so a terminal's Ctrl-C reaches
the program, which then stops it. A helper that dies is replaced (see
:class:`HelperServer`): the discovery record goes at once and comes back,
with the port the new helper serves on, when it serves.

The two ends speak frames over a private socketpair
(:mod:`metrics.export.helper_channel`).

Example:
    >>> from metrics import export
    >>> from metrics.export.helper import HelperServer
    >>> exporter = export.start(metrics.snapshot, port=0,    # doctest: +SKIP
    ...                         server_factory=HelperServer)
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from metrics import config
from metrics.export import discovery
from metrics.export.binding import BindError
from metrics.export.captures import CaptureFn, SnapshotFn, status_name
from metrics.export.helper_channel import Channel, send_quietly
from metrics.export.owner import Caller
from metrics.recording import forksafe
from tpu_info.wire import encoder
from tpu_info.wire.fillers import capture_reply

__all__ = ["HelperServer", "START_TIMEOUT_S", "RESTART_FIRST_S", "RESTART_MAX_S"]

log = logging.getLogger("metrics.export")

START_TIMEOUT_S = 30.0  # the helper has this long to start and bind
RESTART_FIRST_S = 0.5  # a dead helper's first restart waits this long ...
RESTART_MAX_S = 30.0  # ... doubling each try up to this (see HelperServer)


class _HelperGone(BindError):
    """The helper died or never answered while binding."""


class _Link:
    """One helper process and the program's end of its socket."""

    def __init__(self, proc: subprocess.Popen[bytes], channel: Channel) -> None:
        self.proc = proc
        self.channel = channel
        self.replies: queue.Queue[tuple[dict[str, Any], bytes]] = queue.Queue()
        self.serving = False  # bound and started: its death is restarted
        self.started_at = 0.0

    def hang_up(self) -> None:
        """Ends the socket for both sides now (a copy of it elsewhere keeps
        no end open); the helper reads its end of file and leaves."""
        try:
            self.channel.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.channel.sock.close()
        except OSError:
            pass

    def close(self, wait_s: float = 0.0) -> None:
        """Waits up to ``wait_s`` for the helper to leave, then kills it."""
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5.0)
        try:
            self.channel.sock.close()
        except OSError:
            pass


class HelperServer:
    """Starts the helper and answers its requests; stands in for
    :class:`~metrics.export.server.Server` in :func:`metrics.export.start`
    (same constructor, ``bind``, ``start``, ``stop`` and ``port``).

    A helper that dies while serving (``kill -9``, the OOM killer) is
    restarted from the program's helper thread, never the training thread:
    :attr:`on_port_change` is called with ``None`` at once (the exporter
    removes the discovery record, so nobody can pose as the program on the
    freed port), then again with the port once a new helper serves: the
    same port when it is free, else any free one. Tries wait
    :data:`RESTART_FIRST_S`, doubling up to :data:`RESTART_MAX_S`, and go on
    for as long as the program runs; the wait starts over from
    :data:`RESTART_FIRST_S` when the helper that died had served for at
    least :data:`RESTART_MAX_S`.

    When the program dies (SIGTERM, a crash, ``kill -9``) the helper, reading
    its end of file, removes the program's discovery record (the one naming
    its port) before it leaves, so the program needs no SIGTERM handler
    (:attr:`removes_record_at_death`): SIGTERM kills it at once, as without
    the hook, instead of waiting for its main thread to run Python code.
    """

    removes_record_at_death = True

    def __init__(self, snapshot_fn: SnapshotFn, *, address: str = "127.0.0.1",
                 port: int | None = 0,
                 workers: int | None = None, capture_fn: CaptureFn | None = None,
                 local_socket: str | None = None) -> None:
        self.address = address
        self._local_path = local_socket or ""  # the helper listens there too
        self.local_socket = ""
        self.requested_port = port
        self.port = 0
        # port -> None: stopped serving (the helper died); port -> int: serving there.
        self.on_port_change: Callable[[int | None], None] | None = None
        self._snapshot_fn = snapshot_fn
        self._capture_fn = capture_fn
        self._workers = workers
        self._cache = encoder.PartCache()
        self._captures: dict[int, threading.Event] = {}
        self._stopped = False
        self._bound = False
        self._stop_wanted = threading.Event()  # wakes a restart's wait
        self._lock = threading.Lock()  # guards _link against stop() during a restart
        self._delay = RESTART_FIRST_S
        self._owner = forksafe.owned(self)  # a forked copy of the program must not stop it
        env = dict(os.environ)
        # The helper imports this very code, wherever the program found it.
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        # Forty server threads would each get a malloc arena of their own,
        # and freed memory would stay spread over them: two keep RSS steady.
        env.setdefault("MALLOC_ARENA_MAX", "2")
        env.pop(config.AUTOINSTALL.name, None)  # `tpu-info run`'s bootstrap: not for the helper
        self._env = env
        self._link = self._spawn()

    def _spawn(self) -> _Link:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "metrics.export.helper_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=self._env, stdin=subprocess.DEVNULL,
                # Not the program's stdout: whoever reads it to its end (a pipe,
                # `subprocess.run`) must not wait for the helper too.
                stdout=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        link = _Link(proc, Channel(ours))
        threading.Thread(target=self._serve_helper, args=(link,), name="tpu-info-helper",
                         daemon=True).start()
        return link

    def bind(self) -> int:
        """Has the helper bind the port; returns it.

        Raises:
            BindError: the port is taken, or the helper did not start.
        """
        self._bound = True
        try:
            self.port = self._bind(self._link, self.requested_port)
        except _HelperGone:
            self.stop(grace=0)
            raise
        return self.port

    def _bind(self, link: _Link, port: int | None) -> int:
        try:
            link.channel.send({"op": "bind", "address": self.address, "port": port,
                               "workers": self._workers,
                               "capture": self._capture_fn is not None,
                               "capture_secret": (discovery.capture_secret()
                                                  if self._capture_fn is not None else ""),
                               "local_socket": self._local_path})
            reply, _ = link.replies.get(timeout=START_TIMEOUT_S)
        except OSError as e:
            raise _HelperGone(f"the serving helper exited while starting: {e}") from None
        except queue.Empty:
            raise _HelperGone(f"the serving helper did not start within {START_TIMEOUT_S:g}s"
                              ) from None
        if reply.get("op") == "gone":
            raise _HelperGone(reply["message"])
        if reply.get("op") != "bound":
            raise BindError(reply.get("message", "the serving helper could not bind"))
        self.local_socket = str(reply.get("local_socket", ""))
        return int(reply["port"])

    def start(self) -> int:
        if not self._bound:
            self.bind()
        self._start(self._link)
        return self.port

    def _start(self, link: _Link) -> None:
        link.channel.send({"op": "start"})
        link.started_at = time.monotonic()
        link.serving = True

    def _claim_stop(self) -> _Link | None:
        """The link to stop, when this call stops the helper (the first, in
        its owner); captures are told to end."""
        if self._stopped or os.getpid() != self._owner:
            return None
        with self._lock:
            self._stopped = True
            link = self._link
        self._stop_wanted.set()
        for stop in list(self._captures.values()):
            stop.set()
        return link

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops the helper (waits up to ``grace`` + 5 s, then kills it). Idempotent."""
        link = self._claim_stop()
        if link is None:
            return
        try:
            link.channel.send({"op": "stop", "grace": grace or 0})
        except OSError:
            pass  # already gone
        link.close((grace or 0) + 5.0)

    def halt(self) -> None:
        """Stops at once for an ending program: shuts the program's end of
        the socket down, and the helper, reading its end of file, leaves
        (``os._exit``, no gRPC shutdown). Nothing is sent (a send can wait
        on a full socket) and nothing is waited for. Idempotent."""
        link = self._claim_stop()
        if link is not None:
            link.hang_up()

    def let_go_after_fork(self) -> None:
        """In a fork child: closes its copy of the program's end of the
        socket, so the helper still leaves when the program does."""
        try:
            self._link.channel.sock.close()
        except OSError:
            pass

    @property
    def helper_pid(self) -> int:
        return self._link.proc.pid

    def _serve_helper(self, link: _Link) -> None:
        """One helper's thread in the program: blocked in recv until the
        helper asks; if the helper dies while serving, restarts it."""
        while True:
            try:
                message = link.channel.recv()
            except (OSError, ValueError):
                message = None
            if message is None:
                link.replies.put(({"op": "gone", "message":
                                   "the serving helper exited while starting"}, b""))
                if link.serving and not self._stopped and link is self._link:
                    self._restart(link)
                return
            head, _payload = message
            op = head.get("op")
            try:
                if op == "snapshot":
                    self._answer_snapshot(link.channel, head)
                elif op == "capture":
                    threading.Thread(target=self._run_capture, args=(link.channel, head),
                                     daemon=True, name="tpu-info-capture").start()
                elif op == "capture_stop":
                    stop = self._captures.get(head.get("id", -1))
                    if stop is not None:
                        stop.set()
                else:  # bound, bind_error: answers to bind()
                    link.replies.put(message)
            except OSError:
                pass  # the helper went away mid-answer: recv says so next

    def _restart(self, dead: _Link) -> None:
        """Runs on the dead helper's thread until a new helper serves or
        the program stops serving."""
        dead.close()
        for stop in list(self._captures.values()):
            stop.set()
        old_port = self.port
        self._moved(None)
        if time.monotonic() - dead.started_at >= RESTART_MAX_S:
            self._delay = RESTART_FIRST_S
        log.warning("tpu-info: the serving helper (pid %d) exited with status %s; its "
                    "discovery record is removed and a new helper starts in %.1f s",
                    dead.proc.pid, dead.proc.returncode, self._delay)
        while not self._stop_wanted.wait(self._delay):
            self._delay = min(self._delay * 2, RESTART_MAX_S)
            try:
                link = self._spawn()
            except OSError as e:
                log.warning("tpu-info: could not start a serving helper: %s", e)
                continue
            with self._lock:
                if self._stopped:
                    link.close()
                    return
                self._link = link
            try:
                try:  # the same port (None: the local socket alone, as before)
                    port = self._bind(link, None if self.requested_port is None else old_port)
                except BindError:  # taken meanwhile: any free port, and a new record
                    if self.requested_port is None:
                        raise
                    port = self._bind(link, 0)
                self._start(link)
            except (BindError, OSError) as e:
                log.warning("tpu-info: the new serving helper did not start (%s); next try "
                            "in %.1f s", e, self._delay)
                link.close()
                continue
            self.port = port
            self._moved(port)
            log.warning("tpu-info: serving again from a new helper (pid %d) on %s",
                        link.proc.pid, f"port {port}" if port else "the local socket")
            return

    def _moved(self, port: int | None) -> None:
        if self.on_port_change is not None:
            try:
                self.on_port_change(port)
            except Exception as e:  # noqa: BLE001 - serving goes on without a record
                log.warning("tpu-info: could not update the discovery record: %r", e)

    def _answer_snapshot(self, channel: Channel, head: dict[str, Any]) -> None:
        try:
            snap = self._snapshot_fn(int(head["since"]))
            data = encoder.snapshot_to_bytes(snap, self._cache)
        except Exception as e:  # noqa: BLE001 - reported to the caller, never raised here
            channel.send({"op": "error", "id": head["id"], "message": repr(e)})
            return
        channel.send({"op": "snapshot", "id": head["id"]}, data)

    def _run_capture(self, channel: Channel, head: dict[str, Any]) -> None:
        request_id = head["id"]
        stop = self._captures[request_id] = threading.Event()
        try:
            if self._capture_fn is None:
                raise RuntimeError("trace capture is not available in this tpu-info hook")
            # The helper only relays who asked; the check is the capture_fn's, here.
            caller = Caller(token=str(head.get("token", "")), peer=str(head.get("peer", "")))
            out = self._capture_fn(float(head["duration_s"]), bool(head["device"]), stop,
                                   caller)
            reply = capture_reply(out).SerializeToString()
        except Exception as e:  # noqa: BLE001 - becomes the RPC's status in the helper
            send_quietly(channel, {"op": "error", "id": request_id,
                                    "status": status_name(e),
                                    "message": str(e) or type(e).__name__})
        else:
            send_quietly(channel, {"op": "capture", "id": request_id}, reply)
        finally:
            self._captures.pop(request_id, None)
