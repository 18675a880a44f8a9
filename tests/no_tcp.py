"""Runs a command where no TCP or UDP socket can be opened, as on the TPU machine (gVisor).

``python -m tests.no_tcp CMD ARGS...`` installs a seccomp filter that makes
``socket(AF_INET, ...)`` and ``socket(AF_INET6, ...)`` fail with
EAFNOSUPPORT ("Address family not supported by protocol", what gVisor
answers), then execs ``CMD``: the filter holds for it and every process it
starts (a hooked program's serving helper too). Unix sockets still work.
``unshare -n`` is no substitute: its loopback still binds.

The filter is classic BPF over ``struct seccomp_data`` (``nr`` at offset 0,
``arch`` at 4, ``args[0]``'s low word at 16 on little-endian machines):
another architecture's calls, and every other system call, are allowed.

Example:
    >>> available()  # doctest: +SKIP
    True
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import subprocess
import sys

# (AUDIT_ARCH_*, __NR_socket) per machine.
_ARCH = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter: socket(AF_INET or AF_INET6, ...) -> EAFNOSUPPORT, all else allowed."""
    arch, nr_socket = _ARCH[platform.machine()]
    return b"".join([
        _insn(_LD_W_ABS, 0, 0, 4),           # 0: A = arch
        _insn(_JEQ_K, 0, 5, arch),           # 1: another arch -> allow (7)
        _insn(_LD_W_ABS, 0, 0, 0),           # 2: A = nr
        _insn(_JEQ_K, 0, 3, nr_socket),      # 3: not socket() -> allow (7)
        _insn(_LD_W_ABS, 0, 0, 16),          # 4: A = args[0] (its low word)
        _insn(_JEQ_K, 2, 0, 2),              # 5: AF_INET -> refuse (8)
        _insn(_JEQ_K, 1, 0, 10),             # 6: AF_INET6 -> refuse (8)
        _insn(_RET_K, 0, 0, _RET_ALLOW),     # 7
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EAFNOSUPPORT),  # 8
    ])


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """Installs the filter in this process (for good: it cannot be removed).

    Raises:
        OSError: the kernel refused it (no seccomp), or the machine is not
            x86-64 or aarch64.
    """
    if platform.system() != "Linux" or platform.machine() not in _ARCH:
        raise OSError(errno.ENOSYS, f"no filter for {platform.system()} {platform.machine()}")
    code = program()
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _Fprog(len(code) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


_PROBE = ("import socket\nsocket.socket(socket.AF_UNIX).close()\ntry:\n"
          "    socket.socket(socket.AF_INET)\nexcept OSError as e:\n"
          "    raise SystemExit(0 if e.errno == 97 else 1)\nraise SystemExit(1)\n")


def available() -> bool:
    """Whether the filter works here (tried in a child: it binds for good)."""
    try:
        done = subprocess.run([sys.executable, "-m", "tests.no_tcp", sys.executable, "-c",
                               _PROBE], capture_output=True, timeout=60,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.no_tcp CMD [ARGS...]", file=sys.stderr)
        return 2
    install()
    os.execvp(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
