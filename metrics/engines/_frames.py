"""What every engine adapter needs from the host: the user's source line
(the innermost frame outside library code), the library call it went
through, and the host's RAM.

A frame is a *library* frame when its file is in the standard library, in
the engine's own packages or in this hook's, or installed, as the import
system says: its import root (the ``sys.path`` entry it was imported from)
is an installation directory (site-packages, the user's site, the
interpreter's purelib/platlib), or a distribution installed in that root
lists the file's top-level package in its ``.dist-info`` (``pip install
--target DIR`` then ``DIR`` on ``PYTHONPATH``, as flax was on the TPU
machine). The directory's spelling decides only for a file under no import
root of this process. Every other file is the user's (its own project, an
editable install's source tree), and so is any file under a path listed in
``TPU_INFO_USER_PATHS`` (``os.pathsep`` separated: for people whose own code
is installed). Each file is decided once (:meth:`LibraryFrames.kind`); lines
are told apart by their full path, never the file's base name. Of the library frames,
those of other installed packages (flax, optax, transformers ...) are
``LIBRARY``: the outermost one entered from the user's line is named after
it (``via flax nnx.jit``); the engine's, the standard library's and this
hook's are ``ENGINE`` and never named.

Example:
    >>> skip = skip_prefixes()
    >>> user_location(skip, depth=1) is None or ":" in user_location(skip, depth=1)
    True
"""

from __future__ import annotations

import dis
import functools
import os
import site
import sys
import sysconfig
from types import CodeType, FrameType, ModuleType
from typing import Any, NamedTuple

from metrics import config

# What a file is (LibraryFrames.kind).
USER, ENGINE, LIBRARY = 0, 1, 2

_HOOK_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STDLIB = os.path.dirname(os.__file__) + os.sep
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
# Code run from no file that is still the user's: ``python -c``, a REPL, a notebook cell.
_USER_PSEUDO = ("<stdin>", "<string>", "<console>", "<ipython-input")
_ENTRY_POINTS = frozenset({"main", "_main", "run", "train", "cli"})


# CPython 3.11 runs a call as PRECALL then CALL, and a specialized PRECALL
# (float(x), np.asarray(x), a method descriptor's x.item()) makes the call
# itself; while a profile or trace function is set (host_lines.py samples
# the host's work with one) or before it specializes, CALL makes it. One
# call's frames then stop at two offsets (4 bytes apart: PRECALL's one cache
# entry): see :func:`call_instruction`.
_PRECALL, _CALL = dis.opmap.get("PRECALL"), dis.opmap["CALL"]


def call_instruction(code: CodeType, offset: int) -> int:
    """The offset that stands for the instruction at ``offset``: a 3.11
    CALL's is its PRECALL's (4 bytes before), so a read counts as one
    instruction whichever of the two made the call; any other, its own."""
    if _PRECALL is None or offset < 4:
        return offset
    raw = code.co_code  # (deoptimized, cached by the code object)
    if offset < len(raw) and raw[offset] == _CALL and raw[offset - 4] == _PRECALL:
        return offset - 4
    return offset


def site_at(sites: dict[tuple[int, int, int], Any], key: tuple[int, int, int]) -> Any:
    """The site in ``sites`` (``{(kind, id(code), offset): site}``, each with
    its ``code``) of a record's key, its offset as recorded: a CALL's site is
    its PRECALL's (:func:`call_instruction`); None where there is none."""
    site = sites.get(key)
    if site is None and key[2] >= 4:
        site = sites.get((key[0], key[1], key[2] - 4))
        code = getattr(site, "code", None)
        if code is None or call_instruction(code, key[2]) != key[2] - 4:
            return None
    return site


def skip_prefixes(*modules: ModuleType | None) -> tuple[str, ...]:
    """Directories whose frames are library frames, not the user's: this
    hook's packages, the standard library and the given modules' packages
    (beyond these, anything installed is a library: :class:`LibraryFrames`);
    a module that is None (not imported) adds nothing."""
    paths = [os.path.join(_HOOK_ROOT, "metrics") + os.sep, _STDLIB,
             os.path.join(_HOOK_ROOT, "profiler") + os.sep]
    for m in modules:
        f = getattr(m, "__file__", None)
        if f:
            paths.append(os.path.dirname(os.path.abspath(f)) + os.sep)
    return tuple(paths)


def engine_dirs(*modules: ModuleType | None) -> tuple[str, ...]:
    """The engine's (the given modules' packages) and this hook's directories:
    :func:`skip_prefixes` without the standard library."""
    return tuple(p for p in skip_prefixes(*modules) if p != _STDLIB)


def user_paths_from_env() -> tuple[str, ...]:
    """``TPU_INFO_USER_PATHS`` as absolute paths (empty entries dropped)."""
    raw = config.text(config.USER_PATHS)
    return tuple(os.path.abspath(p) for p in raw.split(os.pathsep) if p.strip())


class UserLine(NamedTuple):
    """Where an event happened in the user's code: ``file:line``, and the
    library call that line went through (``flax nnx.jit``; "" for none)."""

    location: str
    via: str


@functools.lru_cache(maxsize=1)
def _install_dirs() -> frozenset[str]:
    """This interpreter's installation directories (site-packages, the
    user's site, purelib/platlib): all of their files are installed."""
    dirs: list[str] = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # an old virtualenv's site module
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    paths = sysconfig.get_paths()
    dirs += [paths[k] for k in ("purelib", "platlib") if k in paths]
    return frozenset(os.path.abspath(d) for d in dirs if d)


def import_root(path: str) -> str | None:
    """The ``sys.path`` entry ``path`` was imported from (the longest that
    holds it; ``''`` is the working directory), or None."""
    best = None
    for entry in list(sys.path):
        if not isinstance(entry, str):
            continue
        root = os.path.abspath(entry or os.curdir)
        inside = path.startswith(root.rstrip(os.sep) + os.sep)
        if inside and (best is None or len(root) > len(best)):
            best = root
    return best


@functools.lru_cache(maxsize=256)
def installed_names(root: str) -> frozenset[str]:
    """The top-level names (``flax``, ``six.py``) the distributions installed
    in ``root`` wrote there, from each ``.dist-info``'s RECORD (its
    ``top_level.txt`` where it has no RECORD): what ``pip install --target
    root`` put there. An egg-info (a legacy editable install of the
    program's own project) installs nothing there."""
    names: set[str] = set()
    try:
        entries = [e for e in os.scandir(root) if e.name.endswith(".dist-info") and e.is_dir()]
    except OSError:
        return frozenset()
    for e in entries:
        try:
            with open(os.path.join(e.path, "RECORD"), encoding="utf-8") as f:
                names.update(line.split(",", 1)[0].split("/", 1)[0] for line in f)
        except OSError:
            try:
                with open(os.path.join(e.path, "top_level.txt"), encoding="utf-8") as f:
                    names.update(line.strip() for line in f)
            except OSError:
                continue
    return frozenset(n for n in names if n and n != ".." and not n.endswith(".dist-info"))


def installed(path: str) -> bool:
    """Whether the import system installed the file at ``path`` (absolute):
    its import root is an installation directory, or a distribution in that
    root lists its top-level name; under no import root, the directory's
    spelling (``site-packages``) is all there is to go by."""
    root = import_root(path)
    if root is None:
        return any(d in path for d in _INSTALLED)
    if root in _install_dirs():
        return True
    top = path[len(root.rstrip(os.sep)) + 1:].split(os.sep, 1)[0]
    return top in installed_names(root)


def via_words(code: CodeType) -> str:
    """A library function in a few words: its distribution's top package,
    the subpackage it lives in when public, and the function (``flax
    nnx.jit`` for a closure in ``flax/nnx/.../compilation.py``'s ``jit``,
    ``flax nnx.Linear`` for ``Linear.__call__``)."""
    path = code.co_filename
    name = getattr(code, "co_qualname", code.co_name).split(".<locals>", 1)[0]
    name = name.removesuffix(".__call__")
    root = import_root(os.path.abspath(path)) if os.sep in path else None
    cut, sep = max((path.rfind(d), d) for d in _INSTALLED)
    if root is not None:
        parts = os.path.abspath(path)[len(root.rstrip(os.sep)) + 1:].split(os.sep)
    elif cut >= 0:
        parts = path[cut + len(sep):].split(os.sep)
    else:
        return f"{os.path.basename(path)} {name}"
    top = parts[0].removesuffix(".py")
    sub = parts[1] if len(parts) > 2 and not parts[1].startswith("_") else ""
    return f"{top} {sub}.{name}" if sub else f"{top} {name}"


class LibraryFrames:
    """Tells the user's frames from library frames (see the module's
    docstring), each file decided once."""

    def __init__(self, skip: tuple[str, ...], user_paths: tuple[str, ...] | None = None) -> None:
        self.skip = skip
        self.user_paths = user_paths_from_env() if user_paths is None else user_paths
        # The engine's and the hook's own directories (the standard library
        # apart: site-packages may live under it, and those are LIBRARY).
        self._engine = tuple(p for p in skip if p != _STDLIB)
        self._kinds: dict[str, int] = {}

    def kind(self, filename: str) -> int:
        """``USER``, ``ENGINE`` or ``LIBRARY`` for a code object's file (cached)."""
        k = self._kinds.get(filename)
        if k is None:
            k = self._decide(filename)
            if len(self._kinds) < 1 << 16:
                self._kinds[filename] = k
        return k

    def _decide(self, fn: str) -> int:
        if fn.startswith("<"):
            return USER if fn.startswith(_USER_PSEUDO) else ENGINE
        path = fn if os.path.isabs(fn) else os.path.abspath(fn)
        for p in self.user_paths:
            if path == p or path.startswith(p.rstrip(os.sep) + os.sep):
                return USER
        if path.startswith(self._engine):
            return ENGINE
        if installed(path):
            return LIBRARY
        return ENGINE if path.startswith(_STDLIB) else USER

    def user_line(self, depth: int = 2) -> UserLine | None:
        """The innermost user frame from ``depth`` frames up, with the
        outermost installed-library frame entered from it (its ``via``);
        with no user frame on the stack, the innermost installed-library
        frame (a program that lives in site-packages). Walks the whole
        stack: for rare events (a compile)."""
        try:
            f: FrameType | None = sys._getframe(depth)
        except ValueError:
            return None
        kind = self.kind
        via: CodeType | None = None
        inner: FrameType | None = None
        while f is not None:
            k = kind(f.f_code.co_filename)
            if k == USER:
                return UserLine(f"{f.f_code.co_filename}:{f.f_lineno}",
                                via_words(via) if via is not None else "")
            if k == LIBRARY:
                via = f.f_code
                inner = inner or f
            f = f.f_back
        if inner is None:
            return None
        return UserLine(f"{inner.f_code.co_filename}:{inner.f_lineno}", "")

    def outer_user_call(self, depth: int = 2) -> str | None:
        """See :func:`outer_user_call`."""
        try:
            f: FrameType | None = sys._getframe(depth)
        except ValueError:
            return None
        frames: list[FrameType] = []  # the user's frames, innermost first
        while f is not None:
            k = self.kind(f.f_code.co_filename)
            if frames and k == LIBRARY:
                break  # the program's launcher (pytest, a CLI's entry point): not the user's
            if k == USER:
                frames.append(f)
            f = f.f_back
        return _outer_call(frames)


@functools.lru_cache(maxsize=16)
def _frames_for(skip: tuple[str, ...], user_paths: str) -> LibraryFrames:
    return LibraryFrames(skip)  # user_paths: the environment's, part of the key only


def frames_for(skip: tuple[str, ...]) -> LibraryFrames:
    """The :class:`LibraryFrames` of ``skip`` (one per skip list and
    ``TPU_INFO_USER_PATHS`` value, kept: its decisions are reused)."""
    return _frames_for(skip, config.text(config.USER_PATHS))


def user_location(skip: tuple[str, ...], depth: int = 2) -> str | None:
    """``file:line`` of the innermost frame outside library code (the user's line)."""
    line = frames_for(skip).user_line(depth + 1)
    return line.location if line is not None else None


def user_line(skip: tuple[str, ...], depth: int = 2) -> UserLine | None:
    """The user's line and the library call it went through (:class:`UserLine`)."""
    return frames_for(skip).user_line(depth + 1)


def _is_entry_point(frame: FrameType) -> bool:
    """A function that is the program itself (``main()``), not a helper to jit."""
    code = frame.f_code
    return code.co_name in _ENTRY_POINTS or code.co_argcount + code.co_kwonlyargcount == 0


def outer_user_call(skip: tuple[str, ...], depth: int = 2) -> str | None:
    """``NAME() at file:line``: the call of the outermost user function (below
    ``main()`` or the module's top level) that leads to the innermost user
    line, with `` via INNER()`` when another function holds that line; None
    when that line is in ``main()`` or at the top level (no call to name).
    Eager code is reached this way (``main`` calls ``accuracy`` calls
    ``predict``): its single-op compiles happen at ``predict``'s line, yet
    ``accuracy`` is what to jit. Walks the whole stack: for rare events (a compile)."""
    return frames_for(skip).outer_user_call(depth + 1)


def _outer_call(frames: list[FrameType]) -> str | None:
    functions = [i for i, fr in enumerate(frames) if fr.f_code.co_name != "<module>"]
    if not functions:
        return None
    outer = functions[-1]
    if _is_entry_point(frames[outer]):  # main() calls the function to jit
        caller, callee = outer, outer - 1
    else:  # the top level (or a library) calls it
        caller, callee = outer + 1, outer
    if callee < 0 or caller >= len(frames):
        return None  # no call: the line is in main() or at the top level itself
    name, inner = frames[callee].f_code.co_name, frames[0].f_code.co_name
    via = f" via {inner}()" if inner != name else ""
    return f"{name}() at {frames[caller].f_code.co_filename}:{frames[caller].f_lineno}{via}"


@functools.lru_cache(maxsize=1)
def host_ram() -> int | None:
    """Total host RAM (read once: it does not change under a process).

    From ``sysconf`` (the kernel's total, the same number as psutil's
    ``virtual_memory().total``): importing psutil inside the program cost
    ~30 ms at its first snapshot, which a short run pays at exit."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): psutil's
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no psutil, no total: callers say N/A
        return None
