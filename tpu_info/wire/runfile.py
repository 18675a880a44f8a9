"""Saved runs: a finished program's last snapshot on disk, in the wire's format.

A saved-run file is :data:`MAGIC` followed by one ``tpu_info.v1.SavedRun``
message: the hook's final ``Snapshot`` (events included, the same bytes the
server sends) and how the program ended. Protobuf fields are only ever
added within v1, so an older file stays readable; a file of a newer major
``format_version`` is refused with what to do.

Reading is as careful as reading the network: a file that is not a regular
file (a FIFO would block), larger than :data:`MAX_FILE_BYTES`, without the
magic, truncated or hostile is refused with one line
(:class:`RunFileError`); the snapshot goes through the same bounded,
validating decoder as a live answer.

Example:
    >>> import tempfile, os
    >>> from tpu_info.contract.model import Snapshot
    >>> from tpu_info.wire.encoder import snapshot_to_bytes
    >>> path = os.path.join(tempfile.mkdtemp(), "run.tpuinfo")
    >>> write(path, encode(snapshot_to_bytes(Snapshot(1.0, uptime_seconds=2.0)), "exit", 3.0))
    >>> read(path).ended
    'exit'
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from dataclasses import dataclass, replace

from tpu_info.contract.errors import TpuInfoError
from tpu_info.contract.model import Snapshot
from tpu_info.contract.safe import clean
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire.codec import snapshot_from_proto
from tpu_info.wire.encoder import _varint as varint  # protobuf's base-128 length

MAGIC = b"TPUINFO-RUN\n"
FORMAT_VERSION = 1
SUFFIX = ".tpurun"
# The largest file read: a full ledger (2,000 graphs), two event rings and
# every distribution fit in a few MB; this bounds what a hostile file costs.
MAX_FILE_BYTES = 64 * 1024 * 1024
DECODE_SECONDS = 10.0
ENDINGS = ("exit", "exception", "signal", "exec", "")
# How a checkpoint (ended "") of a program still running reads.
RUNNING = "running (saved while running)"
# TPU_INFO_SAVE words that turn saving off (read by the hook and by tpu-info run).
OFF_WORDS = frozenset({"0", "off", "no", "false", "none"})
RUNS_DIR = "runs"  # the default folder, in the runtime directory

# SavedRun's field 2 (the snapshot), length-delimited: the hook writes the
# snapshot's encoded bytes as they are, without parsing them again.
_SNAPSHOT_TAG = b"\x12"


class RunFileError(TpuInfoError):
    """A saved-run file that cannot be read, with what to do."""


@dataclass(frozen=True, slots=True)
class SavedRun:
    """One finished run as read back."""

    path: str
    snapshot: Snapshot
    ended: str  # one of ENDINGS
    ended_unix: float
    exit_code: int | None
    signal: str
    error: str
    size_bytes: int

    def how_it_ended(self) -> str:
        """``exit`` (``exit 3`` when the code is known), ``SIGTERM``,
        ``exception: ValueError: bad``, or that it ended without its exit work."""
        if self.ended == "exit":
            known = self.exit_code is not None and self.exit_code >= 0
            return f"exit {self.exit_code}" if known else "exit"
        if self.ended == "signal":
            return self.signal or "signal"
        if self.ended == "exception":
            return f"exception: {self.error}" if self.error else "exception"
        if self.ended == "exec":
            return "exec (the process became another program)"
        return "ended without its exit work (SIGTERM or SIGKILL; saved while running)"

    def with_exit_code(self, code: int | None) -> SavedRun:
        """This run with the exit status its parent saw (``tpu-info run``
        knows it; the hook does not), when it ended by exiting."""
        if code is None or code < 0 or self.ended != "exit":
            return self
        return replace(self, exit_code=code)


def encode(snapshot_bytes: bytes, ended: str, ended_unix: float, *, exit_code: int = -1,
           signal: str = "", error: str = "") -> bytes:
    """The file's bytes: the magic, then ``SavedRun`` with ``snapshot_bytes``
    (an encoded ``tpu_info.v1.Snapshot``) as its snapshot."""
    head = pb.SavedRun(format_version=FORMAT_VERSION, ended=ended, ended_unix=ended_unix,
                       exit_code=exit_code, signal=signal, error=error[:1000])
    return b"".join((MAGIC, head.SerializeToString(), _SNAPSHOT_TAG,
                     varint(len(snapshot_bytes)), snapshot_bytes))


def write(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` to ``path`` whole or not at all (a temporary file in the
    same directory, then a rename), readable by its owner only.

    Raises:
        OSError: the write failed; nothing is left behind.
    """
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".run.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _load(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except FileNotFoundError as e:
        raise RunFileError(f"{path}: no such file (tpu-info runs lists the saved runs)") from e
    except OSError as e:
        raise RunFileError(f"{path}: cannot open it ({e.strerror})") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunFileError(f"{path}: not a regular file; give a saved run's file")
        if st.st_size > MAX_FILE_BYTES:
            raise RunFileError(f"{path}: {st.st_size:,} bytes, more than a saved run can be "
                               f"({MAX_FILE_BYTES:,}); is it one?")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise RunFileError(f"{path}: cannot read it ({e.strerror})") from e
    finally:
        os.close(fd)


def read(path: str | os.PathLike[str]) -> SavedRun:
    """The saved run in ``path``.

    Raises:
        RunFileError: not a saved run, from a newer tpu-info, truncated or
            invalid (the message says which, in one line).
    """
    path = os.fspath(path)
    data = _load(path)
    if not data.startswith(MAGIC):
        raise RunFileError(f"{path}: not a tpu-info saved run (tpu-info runs lists them)")
    try:
        m = pb.SavedRun.FromString(data[len(MAGIC):])
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise RunFileError(f"{path}: truncated or damaged ({clean(e, 200)})") from e
    if m.format_version == 0:  # every writer sets it: the file ends before its head did
        raise RunFileError(f"{path}: truncated ({len(data):,} bytes: it ends before the run "
                           "it holds; a write cut short, or a copy)")
    if m.format_version > FORMAT_VERSION:
        raise RunFileError(f"{path}: saved-run format {m.format_version}, this tpu-info reads "
                           f"up to {FORMAT_VERSION}: upgrade tpu-info to read it")
    if not m.HasField("snapshot"):
        raise RunFileError(f"{path}: holds no snapshot (truncated or damaged)")
    try:
        snapshot = snapshot_from_proto(m.snapshot, deadline=time.monotonic() + DECODE_SECONDS,
                                       seconds=DECODE_SECONDS)
    except TpuInfoError as e:
        raise RunFileError(f"{path}: its snapshot is invalid: {clean(e, 300)}") from e
    ended = m.ended if m.ended in ENDINGS else ""
    return SavedRun(path=path, snapshot=snapshot, ended=ended,
                    ended_unix=m.ended_unix if 0 <= m.ended_unix < 1e11 else 0.0,
                    exit_code=m.exit_code if ended == "exit" else None,
                    signal=clean(m.signal, 32), error=clean(m.error, 300),
                    size_bytes=len(data))
