"""Names bound to JAX's own ``jit``/``pmap`` before the hook wrapped them.

``from jax import jit`` above ``metrics.install()`` binds the real
``jax.jit`` in the program's module before the hook replaces the attribute:
every function jitted through that name goes uncounted (no executions, no
inferred step, no per-step cost). :func:`bound_names` finds such names in the
user's modules (``__main__`` first; libraries, by the rule of
:mod:`metrics.engines._frames`, are left alone) by identity with the
originals, when a snapshot is built: the module list is kept while
``sys.modules`` does not grow, so a snapshot compares a few dozen globals.
:func:`sentence` finds the statement that bound the name (read time only:
the module's source, parsed with :mod:`ast`, once per name) and says it.

Example:
    >>> import jax, metrics                                   # doctest: +SKIP
    >>> from jax import jit   # above install: `jit` is JAX's own  # doctest: +SKIP
    >>> metrics.install()                                     # doctest: +SKIP
    >>> metrics.snapshot().blind_spots[0]                     # doctest: +SKIP
    '`jit` was bound from jax before metrics.install() at train.py:2 (from jax import jit): ...'
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import NamedTuple, TypeVar

from metrics.engines._frames import USER, LibraryFrames

V = TypeVar("V")

MAX_NAMES = 4  # named one by one; more are counted


class Bound(NamedTuple):
    """A module-level name bound to JAX's own ``what`` (``"jit"``, ``"pmap"``)."""

    module: str
    filename: str | None
    name: str
    what: str


def _items(d: dict[str, V]) -> list[tuple[str, V]]:
    """``d``'s items, read while the program may add to it: ``dict.copy`` is one
    C call, but a collection during it can run a finalizer that lets the
    program's thread in (a module's globals grow as its loop first assigns
    them), so a changed size is tried again, then given up (read next time)."""
    for _ in range(3):
        try:
            return list(d.copy().items())
        except RuntimeError:  # changed size during the copy: read it again
            continue
    return []


class _Modules:
    """The user's modules, ``__main__`` first, kept while ``sys.modules`` keeps its size."""

    def __init__(self) -> None:
        self._size = -1
        self._mods: list[tuple[str, ModuleType]] = []

    def of(self, frames: LibraryFrames) -> list[tuple[str, ModuleType]]:
        mods = sys.modules
        if len(mods) != self._size:
            self._size = len(mods)
            found = []
            for name, m in _items(mods):
                f = getattr(m, "__file__", None)
                if name == "__main__" or (isinstance(f, str) and frames.kind(f) == USER):
                    found.append((name, m))
            found.sort(key=lambda nm: nm[0] != "__main__")
            self._mods = found
        return self._mods


_modules = _Modules()


def bound_names(originals: Mapping[str, object], frames: LibraryFrames) -> list[Bound]:
    """Names in the user's modules bound to one of ``originals`` (``what ->``
    JAX's own function), ``__main__``'s first."""
    by_id = {id(v): k for k, v in originals.items() if v is not None}
    out = []
    for modname, m in _modules.of(frames):
        space = getattr(m, "__dict__", None)
        if not isinstance(space, dict):
            continue
        for name, value in _items(space):
            what = by_id.get(id(value))
            if what is not None and value is originals[what] and not name.startswith("__"):
                out.append(Bound(modname, getattr(m, "__file__", None), name, what))
    return out


@functools.lru_cache(maxsize=64)
def statement(filename: str, name: str, what: str) -> tuple[int, str] | None:
    """``(line, words)`` of the statement in ``filename`` that bound ``name``
    to JAX's ``what`` (``from jax import jit``, ``jit = jax.jit``); None when
    the source cannot say."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "jax":
            for a in node.names:
                if a.name == what and (a.asname or a.name) == name:
                    alias = f" as {a.asname}" if a.asname else ""
                    found.append((node.lineno, f"from {node.module} import {what}{alias}"))
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
              and node.value.attr == what
              and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
            found.append((node.lineno, f"{name} = {ast.unparse(node.value)}"))
    return min(found) if found else None


def _shown(path: str) -> str:
    """A path as short as it is clear: relative to the working directory when under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir) else rel


def sentence(b: Bound) -> str:
    """The blind spot in words, with the binding statement's place."""
    where = f"in {b.module}"
    if b.filename:
        st = statement(b.filename, b.name, b.what)
        where = (f"at {_shown(b.filename)}:{st[0]} ({st[1]})" if st is not None
                 else f"in {_shown(b.filename)}")
    return (f"`{b.name}` was bound from jax before metrics.install() {where}: its functions "
            "are not counted; call metrics.install() above that import, or run under "
            "`tpu-info run`")


def sentences(originals: Mapping[str, object], frames: LibraryFrames) -> list[str]:
    """One sentence per name bound before install (at most :data:`MAX_NAMES`, then a count)."""
    found = bound_names(originals, frames)
    out = [sentence(b) for b in found[:MAX_NAMES]]
    if len(found) > MAX_NAMES:
        out.append(f"{len(found) - MAX_NAMES} more names were bound to jax.jit or jax.pmap "
                   "before metrics.install() and are not counted either")
    return out
