"""Whether a user's line runs in a generator function: a data loader that
yields batches (``def batches(): ... yield x[idx]``), which ``jax.jit``
cannot hold, so work there is moved out another way than by jitting it.

Read at read time only, once per site (:func:`metrics.engines.jax.sites.by_line`, and the torch
and JAX host lines),
never on the hot path: the site's code object says it (``co_flags`` has
``CO_GENERATOR``). A generator expression (``tuple(a[idx] for a in arrays)``)
is a generator of its own; it counts as the enclosing function's, found
once per expression among the code objects of the module that defined it
(its functions' and classes' code and the code nested in them).

Example:
    >>> def batches(a):
    ...     yield a
    >>> in_generator(batches.__code__), in_generator(in_generator.__code__)
    (True, False)
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Iterable
from types import CodeType, FunctionType

MAX_CODES = 4096  # code objects looked at, at most, for one expression's enclosing function
MAX_KEPT = 256  # expressions whose enclosing function is kept
_NESTED = frozenset({"<genexpr>"})  # generator code that is not a function of its own
_FOUND: dict[int, tuple[CodeType, CodeType | None]] = {}  # id(code) -> (code, enclosing)


def in_generator(code: CodeType | None) -> bool:
    """Whether ``code`` is a generator function's, or a generator
    expression's inside one (found by :func:`enclosing`)."""
    for _ in range(8):  # expressions nested in expressions
        if code is None or not code.co_flags & inspect.CO_GENERATOR:
            return False
        if code.co_name not in _NESTED:
            return True
        code = enclosing(code)
    return False


def enclosing(code: CodeType) -> CodeType | None:
    """The code object ``code`` is nested in (its ``co_consts`` hold it),
    among the module that defined it; None when not found (a module-level
    expression, a module not imported by name). Found once per code object
    (kept by identity: equal code objects of two files are two)."""
    hit = _FOUND.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    found = _search(code)
    if len(_FOUND) < MAX_KEPT:
        _FOUND[id(code)] = (code, found)  # the code held: its id is never reused
    return found


def _search(code: CodeType) -> CodeType | None:
    module = _module_of(code.co_filename)
    if module is None:
        return None
    stack = [c for c in _codes(vars(module).values()) if c.co_filename == code.co_filename]
    seen = 0
    while stack and seen < MAX_CODES:
        c = stack.pop()
        seen += 1
        for k in c.co_consts:
            if k is code:
                return c
            if isinstance(k, CodeType):
                stack.append(k)
    return None


def _codes(values: Iterable[object]) -> list[CodeType]:
    """The code of the functions among ``values`` and of the classes' methods
    (static and class methods too): where the module's code is reached from."""
    out = []
    for value in list(values):
        for v in list(vars(value).values()) if isinstance(value, type) else (value,):
            if isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            if isinstance(v, FunctionType):
                out.append(v.__code__)
    return out


def _module_of(filename: str) -> object | None:
    """The imported module whose file is ``filename`` (``__main__`` too)."""
    path = os.path.abspath(filename)
    for module in list(sys.modules.values()):
        f = getattr(module, "__file__", None)
        if isinstance(f, str) and os.path.abspath(f) == path:
            return module
    return None
