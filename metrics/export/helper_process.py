"""The serving helper's side: ``python -m metrics.export.helper_process FD``.

The process :class:`metrics.export.helper.HelperServer` starts beside the
program. It binds the port the program asked for, runs the same
:class:`~metrics.export.server.Server` as in-process serving, and answers
every call from :class:`_Mirror`, the program's snapshot as last fetched
over the socketpair (at most one fetch every :data:`REFRESH_S`). Captures
are checked here first (the owner's secret, handed over the private
socketpair) and then forwarded to the program, which checks again and
records. It exits when the program's end of the socket closes.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import queue
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from metrics.export import owner
from metrics.export.binding import BindError
from metrics.export.captures import CaptureFn
from metrics.export.helper_channel import Channel
from metrics.export.owner import Caller
from metrics.export.server import Server
from metrics.recording.events import EventLog
from tpu_info.contract.captures import CaptureFile, RemoteCapture
from tpu_info.contract.discovery_record import runtime_dir
from tpu_info.contract.model import Snapshot
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire

__all__ = ["main", "REFRESH_S", "ANSWER_TIMEOUT_S", "MIRROR_EVENTS", "MAX_EVENTS",
           "GC_INTERVAL_S", "HELPER_CALLS_PER_S"]

REFRESH_S = 0.1  # the mirror is refreshed at most this often
ANSWER_TIMEOUT_S = 10.0  # the program has this long to hand over a snapshot
MIRROR_EVENTS = 10_000  # events the helper keeps (the program's ring size)
MAX_EVENTS = 1000  # events in one answer, as in-process serving (snapshot.build)
GC_INTERVAL_S = 2.0  # the helper's full garbage collections (see _collect_garbage)
HELPER_CALLS_PER_S = 1000.0  # the helper's CallPacer (in-process serving: CALLS_PER_S)


class _RemoteError(Exception):
    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.grpc_status = status


class _Mirror:
    """The program's snapshot as the helper last fetched it, with the events
    of the fetches before; refreshed on demand, at most every REFRESH_S."""

    def __init__(self, channel: Channel) -> None:
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
            # At most MAX_EVENTS, chosen as the program's own server would; read
            # with the snapshot they go with (under the lock: a refresh in between
            # would add events past its last_seq, which a reader gets twice).
            events, _ = self._events.since(events_since, limit=MAX_EVENTS)
        assert snap is not None
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


def _capture_forwarder(mirror: _Mirror, channel: Channel, secret: str) -> CaptureFn:
    def capture(duration_s: float, device: bool, stop: threading.Event,
                caller: Caller) -> RemoteCapture:
        owner.check(caller, secret)  # here first; the program checks again
        def waiting(request_id: int) -> None:
            if stop.is_set():
                channel.send({"op": "capture_stop", "id": request_id})

        _, payload = mirror.ask({"op": "capture", "duration_s": duration_s, "device": device,
                                 "token": caller.token, "peer": caller.peer},
                                duration_s + 60.0, waiting)
        reply = pb.CaptureReply.FromString(payload)
        files = tuple(CaptureFile(f.name, f.size_bytes, f.data, f.server_path)
                      for f in reply.files)
        return RemoteCapture(reply.trace, reply.format, files, tuple(reply.notes),
                             reply.truncated, reply.event_count)

    return capture


def _collect_garbage(done: threading.Event) -> None:
    """Every call leaves some grpcio objects in reference cycles, which the
    collector's oldest generation frees only now and then: this process has
    nothing better to do, so it collects every few seconds and its memory
    stays level instead of a saw tooth."""
    while not done.wait(GC_INTERVAL_S):
        gc.collect()


def _remove_record(program: int, port: int) -> None:
    """Removes the program's discovery record (and its socket file) if it
    still names this helper's port, or the socket alone when it wrote none:
    the program died without removing it (SIGTERM kills it with no handler
    of the hook's, a crash, ``kill -9``).
    A program that ended normally removed it itself. Never raises."""
    try:
        path = runtime_dir() / f"{program}.json"
        try:
            record = json.loads(path.read_bytes())
        except FileNotFoundError:  # killed before it wrote one: its socket goes alone
            record = None
        if record is not None:
            if record.get("pid") != program or record.get("port") != port:
                return  # not the record of this helper's program any more
            path.unlink()
        sock = path.with_suffix(".sock")
        st = os.lstat(sock)
        if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid():
            sock.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """The helper process: ``python -m metrics.export.helper FD``."""
    args = sys.argv[1:] if argv is None else argv
    program = os.getppid()  # before the program can die and leave us to init
    channel = Channel(socket.socket(fileno=int(args[0])))
    mirror = _Mirror(channel)
    server: Server | None = None
    done = threading.Event()
    threading.Thread(target=_collect_garbage, args=(done,), name="tpu-info-gc",
                     daemon=True).start()
    while not done.is_set():
        try:
            message = channel.recv()
        except (OSError, ValueError):
            # Killed with our request unread in its socket, the program's end
            # resets ours (ECONNRESET, not an end of file): gone all the same.
            message = None
        if message is None:  # the program is gone or ending: leave at once
            if server is not None:  # (the caller's os._exit closes the port)
                _remove_record(program, server.port)
            return 0
        head, payload = message
        op = head.get("op")
        if op == "bind":
            port = head["port"]  # None: the local socket alone
            kwargs: dict[str, Any] = {"address": head["address"],
                                      "port": None if port is None else int(port)}
            if head.get("workers"):
                kwargs["workers"] = int(head["workers"])
            if head.get("local_socket"):
                kwargs["local_socket"] = str(head["local_socket"])
            if head.get("capture"):
                kwargs["capture_fn"] = _capture_forwarder(mirror, channel,
                                                          str(head.get("capture_secret", "")))
            # Same limits as in-process serving; a higher call rate, since
            # the program pays one refresh per REFRESH_S whatever it is.
            server = Server(mirror.snapshot, calls_per_s=HELPER_CALLS_PER_S, **kwargs)
            try:
                channel.send({"op": "bound", "port": server.bind(),
                              "local_socket": server.local_socket})
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
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:  # noqa: BLE001 - never into finalization (below), whatever happened
        import traceback

        traceback.print_exc()
        code = 1
    # Leave at once, returned or raised: the helper has nothing to flush or
    # remove. Interpreter finalization blocks in gRPC's C-core shutdown while
    # a client is connected: a helper whose recv raised ECONNRESET stayed in
    # epoll_wait, listening on the port (one for 78 minutes; a TUI test's
    # port, at load 20, for minutes).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
