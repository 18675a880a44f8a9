"""Serving from a helper process: the same two services, with grpcio's
per-call work kept out of the watched program.

``metrics.install(serve="process")`` (or ``TPU_INFO_SERVE=process``) starts
``python -m metrics.export.helper`` next to the program. The helper binds the
port (same rules as in-process serving), runs the gRPC server and answers
every call from a mirror of the program's snapshot. The program keeps one
thread that sleeps in ``recv`` until the helper asks for a fresh snapshot:
at most one every :data:`REFRESH_S` while clients are asking, however many
there are, each carrying only the events since the previous one. So a
program watched by hundreds of calls a second builds ten snapshots a
second, and the gRPC machinery (HTTP/2, threads, the GIL hand-offs of every
call) runs in the helper's interpreter, not the program's.

What the helper costs: one more process (~40 MB), about half a second to
start (``install`` waits for the port), and answers up to :data:`REFRESH_S`
old. ``Capture`` calls are forwarded with the caller's token and address:
the program decides whether to record (:mod:`metrics.export.owner`) and
records the trace itself. The helper is handed the capture secret over the
private socketpair and refuses everyone else first, so a flood of refused
captures never reaches the program.
The helper exits when the program's end of the socket closes (exit, crash,
``kill -9``), and it is in its own session, so a terminal's Ctrl-C reaches
the program, which then stops it. A helper that dies is replaced (see
:class:`HelperServer`): the discovery record goes at once and comes back,
with the port the new helper serves on, when it serves.

The two ends speak frames over a private socketpair: an 8-byte header
(JSON length, payload length), a JSON object with ``op``, and raw bytes.

Example:
    >>> from metrics import export
    >>> from metrics.export.helper import HelperServer
    >>> exporter = export.start(metrics.snapshot, port=0,    # doctest: +SKIP
    ...                         server_factory=HelperServer)
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from metrics import forksafe
from metrics.events import EventLog
from metrics.export import config, discovery, owner
from metrics.export.owner import Caller
from metrics.export.server import (
    BindError,
    CaptureFn,
    Server,
    SnapshotFn,
    capture_reply,
    capture_status,
)
from tpu_info import encoder, wire
from tpu_info.model import Snapshot
from tpu_info.proto import tpu_info_v1_pb2 as pb

log = logging.getLogger("metrics.export")

REFRESH_S = 0.1  # the mirror is refreshed at most this often
START_TIMEOUT_S = 30.0  # the helper has this long to start and bind
ANSWER_TIMEOUT_S = 10.0  # the program has this long to hand over a snapshot
MIRROR_EVENTS = 10_000  # events the helper keeps (the program's ring size)
MAX_EVENTS = 1000  # events in one answer, as in-process serving (snapshot.build)
GC_INTERVAL_S = 2.0  # the helper's full garbage collections (see _collect_garbage)
RESTART_FIRST_S = 0.5  # a dead helper's first restart waits this long ...
RESTART_MAX_S = 30.0  # ... doubling each try up to this (see HelperServer)
HELPER_CALLS_PER_S = 1000.0  # the helper's CallPacer (in-process serving: CALLS_PER_S)
_HEADER = struct.Struct(">II")
_MAX_FRAME = 256 * 1024 * 1024


class _Channel:
    """Framed messages over one stream socket; sends are thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        head = json.dumps(header).encode()
        with self._send_lock:
            self.sock.sendall(_HEADER.pack(len(head), len(payload)) + head + payload)

    def recv(self) -> tuple[dict[str, Any], bytes] | None:
        """The next message, or None when the other end closed."""
        sizes = self._exactly(_HEADER.size)
        if sizes is None:
            return None
        head_len, payload_len = _HEADER.unpack(sizes)
        if head_len > _MAX_FRAME or payload_len > _MAX_FRAME:
            raise ValueError("oversized frame from the other end")
        head = self._exactly(head_len)
        payload = self._exactly(payload_len) if payload_len else b""
        if head is None or payload is None:
            return None
        return json.loads(head), payload

    def _exactly(self, n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


# The program's side ----------------------------------------------------------


class _HelperGone(BindError):
    """The helper died or never answered while binding."""


class _Link:
    """One helper process and the program's end of its socket."""

    def __init__(self, proc: subprocess.Popen[bytes], channel: _Channel) -> None:
        self.proc = proc
        self.channel = channel
        self.replies: queue.Queue[tuple[dict[str, Any], bytes]] = queue.Queue()
        self.serving = False  # bound and started: its death is restarted
        self.started_at = 0.0

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
    """

    def __init__(self, snapshot_fn: SnapshotFn, *, address: str = "127.0.0.1", port: int = 0,
                 workers: int | None = None, capture_fn: CaptureFn | None = None) -> None:
        self.address = address
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
                [sys.executable, "-m", "metrics.export.helper", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=self._env, stdin=subprocess.DEVNULL,
                start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        link = _Link(proc, _Channel(ours))
        threading.Thread(target=self._serve_helper, args=(link,), name="tpu-info-helper",
                         daemon=True).start()
        return link

    def bind(self) -> int:
        """Has the helper bind the port; returns it.

        Raises:
            BindError: the port is taken, or the helper did not start.
        """
        try:
            self.port = self._bind(self._link, self.requested_port)
        except _HelperGone:
            self.stop(grace=0)
            raise
        return self.port

    def _bind(self, link: _Link, port: int) -> int:
        try:
            link.channel.send({"op": "bind", "address": self.address, "port": port,
                               "workers": self._workers,
                               "capture": self._capture_fn is not None,
                               "capture_secret": (discovery.capture_secret()
                                                  if self._capture_fn is not None else "")})
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
        return int(reply["port"])

    def start(self) -> int:
        if not self.port:
            self.bind()
        self._start(self._link)
        return self.port

    def _start(self, link: _Link) -> None:
        link.channel.send({"op": "start"})
        link.started_at = time.monotonic()
        link.serving = True

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops the helper (waits up to ``grace`` + 5 s, then kills it). Idempotent."""
        if self._stopped or os.getpid() != self._owner:
            return
        with self._lock:
            self._stopped = True
            link = self._link
        self._stop_wanted.set()
        for stop in list(self._captures.values()):
            stop.set()
        try:
            link.channel.send({"op": "stop", "grace": grace or 0})
        except OSError:
            pass  # already gone
        link.close((grace or 0) + 5.0)

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
                try:
                    port = self._bind(link, old_port)
                except BindError:  # taken meanwhile: any free port, and a new record
                    port = self._bind(link, 0)
                self._start(link)
            except (BindError, OSError) as e:
                log.warning("tpu-info: the new serving helper did not start (%s); next try "
                            "in %.1f s", e, self._delay)
                link.close()
                continue
            self.port = port
            self._moved(port)
            log.warning("tpu-info: serving again from a new helper (pid %d) on port %d",
                        link.proc.pid, port)
            return

    def _moved(self, port: int | None) -> None:
        if self.on_port_change is not None:
            try:
                self.on_port_change(port)
            except Exception as e:  # noqa: BLE001 - serving goes on without a record
                log.warning("tpu-info: could not update the discovery record: %r", e)

    def _answer_snapshot(self, channel: _Channel, head: dict[str, Any]) -> None:
        try:
            snap = self._snapshot_fn(int(head["since"]))
            data = encoder.snapshot_to_bytes(snap, self._cache)
        except Exception as e:  # noqa: BLE001 - reported to the caller, never raised here
            channel.send({"op": "error", "id": head["id"], "message": repr(e)})
            return
        channel.send({"op": "snapshot", "id": head["id"]}, data)

    def _run_capture(self, channel: _Channel, head: dict[str, Any]) -> None:
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
            _send_quietly(channel, {"op": "error", "id": request_id,
                                    "status": capture_status(e).name,
                                    "message": str(e) or type(e).__name__})
        else:
            _send_quietly(channel, {"op": "capture", "id": request_id}, reply)
        finally:
            self._captures.pop(request_id, None)


def _send_quietly(channel: _Channel, header: dict[str, Any], payload: bytes = b"") -> None:
    try:
        channel.send(header, payload)
    except OSError:
        pass


# The helper's side -----------------------------------------------------------


class _RemoteError(Exception):
    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.grpc_status = status


@dataclasses.dataclass
class _Capture:
    trace: bytes
    format: str
    files: list[Any]
    notes: list[str]
    truncated: bool
    event_count: int


class _Mirror:
    """The program's snapshot as the helper last fetched it, with the events
    of the fetches before; refreshed on demand, at most every REFRESH_S."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()  # one fetch at a time; others wait for it
        self._pending: dict[int, queue.Queue[tuple[dict[str, Any], bytes]]] = {}
        self._ids = iter(range(1, 2**62))
        self._snapshot: Snapshot | None = None
        self._fetched = 0.0
        self._events = EventLog(capacity=MIRROR_EVENTS)
        # Unchanged parts keep their records, so the server's encoder reuses
        # their bytes too (it finds unchanged parts by identity).
        self._parts = wire.DecodeCache()

    def snapshot(self, events_since: int) -> Snapshot:
        """The mirrored snapshot with the events after ``events_since``."""
        with self._lock:
            if self._snapshot is None or time.monotonic() - self._fetched >= REFRESH_S:
                self._refresh()
            snap = self._snapshot
        assert snap is not None
        # At most MAX_EVENTS, chosen as the program's own server would.
        events, _ = self._events.since(events_since, limit=MAX_EVENTS)
        return dataclasses.replace(snap, events=tuple(events))

    def _refresh(self) -> None:
        since = self._snapshot.last_seq if self._snapshot is not None else 0
        head, payload = self.ask({"op": "snapshot", "since": since}, ANSWER_TIMEOUT_S)
        snap = wire.snapshot_from_proto(pb.Snapshot.FromString(payload), self._parts)
        if snap.last_seq < since:  # the program's events were cleared
            self._events = EventLog(capacity=MIRROR_EVENTS)
        self._events.mirror(snap.events)
        self._snapshot = snap
        self._fetched = time.monotonic()

    def ask(self, header: dict[str, Any], timeout: float,
            waiting: Callable[[int], None] | None = None) -> tuple[dict[str, Any], bytes]:
        """Sends a request to the program and waits for its answer.

        ``waiting(id)`` runs every second while waiting (a capture checks
        whether its client went away).
        """
        request_id = next(self._ids)
        box: queue.Queue[tuple[dict[str, Any], bytes]] = queue.Queue(maxsize=1)
        self._pending[request_id] = box
        try:
            self._channel.send({**header, "id": request_id})
            deadline = time.monotonic() + timeout
            while True:
                try:
                    head, payload = box.get(timeout=max(0.0, min(1.0, deadline
                                                                 - time.monotonic())))
                    break
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"the program did not answer within {timeout:g}s"
                                           ) from None
                    if waiting is not None:
                        waiting(request_id)
        finally:
            self._pending.pop(request_id, None)
        if head.get("op") == "error":
            raise _RemoteError(head.get("message", "the program failed"), head.get("status"))
        return head, payload

    def deliver(self, head: dict[str, Any], payload: bytes) -> None:
        box = self._pending.get(head.get("id", -1))
        if box is not None:
            box.put((head, payload))


def _capture_forwarder(mirror: _Mirror, channel: _Channel, secret: str) -> CaptureFn:
    def capture(duration_s: float, device: bool, stop: threading.Event,
                caller: Caller) -> _Capture:
        owner.check(caller, secret)  # here first; the program checks again
        def waiting(request_id: int) -> None:
            if stop.is_set():
                channel.send({"op": "capture_stop", "id": request_id})

        _, payload = mirror.ask({"op": "capture", "duration_s": duration_s, "device": device,
                                 "token": caller.token, "peer": caller.peer},
                                duration_s + 60.0, waiting)
        reply = pb.CaptureReply.FromString(payload)
        return _Capture(reply.trace, reply.format, list(reply.files), list(reply.notes),
                        reply.truncated, reply.event_count)

    return capture


def _collect_garbage(done: threading.Event) -> None:
    """Every call leaves some grpcio objects in reference cycles, which the
    collector's oldest generation frees only now and then: this process has
    nothing better to do, so it collects every few seconds and its memory
    stays level instead of a saw tooth."""
    while not done.wait(GC_INTERVAL_S):
        gc.collect()


def main(argv: list[str] | None = None) -> int:
    """The helper process: ``python -m metrics.export.helper FD``."""
    args = sys.argv[1:] if argv is None else argv
    channel = _Channel(socket.socket(fileno=int(args[0])))
    mirror = _Mirror(channel)
    server: Server | None = None
    done = threading.Event()
    threading.Thread(target=_collect_garbage, args=(done,), name="tpu-info-gc",
                     daemon=True).start()
    while not done.is_set():
        message = channel.recv()
        if message is None:  # the program is gone
            break
        head, payload = message
        op = head.get("op")
        if op == "bind":
            kwargs: dict[str, Any] = {"address": head["address"], "port": int(head["port"])}
            if head.get("workers"):
                kwargs["workers"] = int(head["workers"])
            if head.get("capture"):
                kwargs["capture_fn"] = _capture_forwarder(mirror, channel,
                                                          str(head.get("capture_secret", "")))
            # Same limits as in-process serving; a higher call rate, since
            # the program pays one refresh per REFRESH_S whatever it is.
            server = Server(mirror.snapshot, calls_per_s=HELPER_CALLS_PER_S, **kwargs)
            try:
                channel.send({"op": "bound", "port": server.bind()})
            except BindError as e:
                channel.send({"op": "bind_error", "message": str(e)})
                server = None
        elif op == "start" and server is not None:
            server.start()
        elif op == "stop":
            done.set()
            if server is not None:
                server.stop(float(head.get("grace", 0)))
                server = None
        else:
            mirror.deliver(head, payload)
    if server is not None:
        server.stop(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
