"""What every engine adapter needs from the host: the user's source line
(the innermost frame outside library code) and the host's RAM.

Example:
    >>> skip = skip_prefixes()
    >>> user_location(skip, depth=1) is None or ":" in user_location(skip, depth=1)
    True
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any


def skip_prefixes(*modules: Any) -> tuple[str, ...]:
    """Directories whose frames are library frames, not the user's: the given
    modules' packages, this hook's package and the standard library."""
    metrics_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [metrics_dir + os.sep, os.path.dirname(os.__file__) + os.sep]
    for m in modules:
        f = getattr(m, "__file__", None)
        if f:
            paths.append(os.path.dirname(os.path.abspath(f)) + os.sep)
    return tuple(paths)


def user_location(skip: tuple[str, ...], depth: int = 2) -> str | None:
    """``file:line`` of the innermost frame outside ``skip`` (the user's line)."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(skip) and not fn.startswith("<"):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return None


_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_ENTRY_POINTS = frozenset({"main", "_main", "run", "train", "cli"})


def _is_entry_point(frame: Any) -> bool:
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
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    frames = []  # the user's frames, innermost first
    while f is not None:
        fn = f.f_code.co_filename
        if frames and any(d in fn for d in _INSTALLED):
            break  # the program's launcher (pytest, a CLI's entry point): not the user's
        if not fn.startswith(skip) and not fn.startswith("<"):
            frames.append(f)
        f = f.f_back
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
    """Total host RAM (read once: it does not change under a process)."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no psutil, no total: callers say N/A
        return None
