"""Which numpy conversion calls read a jax.Array, seen by the profile
function of :mod:`metrics.engines.jax.host_lines` in its sampled intervals.

On the CPU backend ``np.asarray(loss)`` and ``np.array(loss)`` read a
jax.Array through numpy's buffer protocol, in C: no Python runs, so the
transfer hook (``ArrayImpl._value``) never sees them, yet the host blocks
there until the step that makes ``loss`` is done (flax's nnx vae example:
``losses.append(np.asarray(loss))`` every step, 4-24 % of its step by A/B).
Wrapping numpy's functions would cost every call of them in the process
(JAX's own included); instead, only inside the sampled intervals, the
profile function's ``c_call`` event of one of :func:`readers` asks
:func:`jax_read` what the call's first argument is. A C call's arguments are
not on any frame: the caller's bytecode says (decided once per call site:
the instructions between the callee's load and the call), where it is a
plain name (``np.asarray(loss)``) or a constant subscript of one
(``np.array(out["loss"])``); anything else (``np.asarray(x + 1)``, an
attribute, which could run a property) is not looked at. The name is then
read from the caller's locals or globals, never evaluated.

Example:
    >>> import numpy as np
    >>> def f(loss):
    ...     return np.asarray(loss)
    >>> [i.opname for i in _arg_span(f.__code__, _call_offset(f.__code__), "asarray")]
    ['LOAD_FAST']
"""

from __future__ import annotations

import builtins
import dis
import sys
from types import CodeType, FrameType
from typing import Any

# The loads a plain name comes from, and where it is looked up.
_LOADS = {"LOAD_FAST": "fast", "LOAD_NAME": "name", "LOAD_GLOBAL": "global",
          "LOAD_DEREF": "fast", "LOAD_CLASSDEREF": "fast"}
_CALLS = ("PRECALL", "CALL", "KW_NAMES", "CALL_FUNCTION_EX")
MAX_SITES = 4096  # call sites decided and kept


def readers() -> tuple[Any, ...]:
    """numpy's conversion functions that read an object's buffer in C."""
    import numpy as np

    return tuple(f for f in (np.asarray, np.array, np.asanyarray, np.ascontiguousarray)
                 if type(f).__name__ == "builtin_function_or_method")


class Resolver:
    """The first argument of a numpy conversion call, per call site (its
    code and instruction offset, decided once)."""

    def __init__(self) -> None:
        self._sites: dict[tuple[int, int], tuple[CodeType, tuple[str, str, Any] | None]] = {}
        self._array: Any = None  # jax._src.array.ArrayImpl, once JAX has it
        self.waiting = False  # the latest read's array was not ready when looked at

    def jax_read(self, frame: FrameType, fn: Any) -> int:
        """Bytes a call of ``fn`` at ``frame`` reads from the device: its first
        argument's, where that is a jax.Array on the CPU with no host copy
        yet; 0 otherwise (not a jax.Array, not told from the bytecode)."""
        code = frame.f_code
        key = (id(code), frame.f_lasti)
        hit = self._sites.get(key)
        if hit is None or hit[0] is not code:
            how = _how(code, frame.f_lasti, getattr(fn, "__name__", ""))
            if len(self._sites) < MAX_SITES:
                self._sites[key] = (code, how)
        else:
            how = hit[1]
        if how is None:
            return 0
        value: Any = _value(frame, how)
        array = self._array
        if array is None:
            mod = sys.modules.get("jax._src.array")
            array = self._array = getattr(mod, "ArrayImpl", None)
            if array is None:
                return 0
        if value.__class__ is not array or value._npy_value is not None:
            return 0
        try:  # elsewhere numpy goes through __array__: the transfer hook counts it
            if not all(d.platform == "cpu" for d in value.devices()):
                return 0
            self.waiting = not value.is_ready()  # (the time this look took: waited anyway)
            return int(value.nbytes)
        except Exception:  # noqa: BLE001 - a deleted or odd array: not a read here
            return 0


_MISSING: Any = object()


def _value(frame: FrameType, how: tuple[str, str, Any]) -> Any:
    scope, name, key = how
    if scope == "global":
        value = frame.f_globals.get(name, _MISSING)
    else:
        value = frame.f_locals.get(name, _MISSING)
        if value is _MISSING and scope == "name":
            value = frame.f_globals.get(name, _MISSING)
            if value is _MISSING:
                value = getattr(builtins, name, _MISSING)
    if key is not _MISSING and value.__class__ in (dict, list, tuple):
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    elif key is not _MISSING:
        return _MISSING
    return value


def _how(code: CodeType, offset: int, name: str) -> tuple[str, str, Any] | None:
    """(scope, name, constant subscript or _MISSING) of the call's first
    argument at ``offset``, or None where it is no plain name."""
    try:
        span = _arg_span(code, offset, name)
    except Exception:  # noqa: BLE001 - bytecode we do not read: no argument
        return None
    if not span or span[0].opname not in _LOADS or not isinstance(span[0].argval, str):
        return None
    first = span[0]
    if len(span) == 1:
        return _LOADS[first.opname], first.argval, _MISSING
    if (len(span) == 3 and span[1].opname == "LOAD_CONST"
            and span[2].opname == "BINARY_SUBSCR"
            and isinstance(span[1].argval, (str, int))):
        return _LOADS[first.opname], first.argval, span[1].argval
    return None


def _arg_span(code: CodeType, offset: int, name: str) -> list[dis.Instruction]:
    """The instructions that push the first argument of the call at
    ``offset`` whose callee was loaded by the name ``name`` ([] where not
    found or where a jump is among them)."""
    instrs = list(dis.get_instructions(code))
    end = next((i for i, x in enumerate(instrs) if x.offset == offset), None)
    if end is None:
        return []
    start = next((i for i in range(end - 1, -1, -1) if instrs[i].argval == name
                  and instrs[i].opname.startswith("LOAD_")), None)
    if start is None:
        return []
    depth, last = 0, -1
    body = []
    for x in instrs[start + 1:end]:
        if x.opname in _CALLS:
            break
        if x.opcode in dis.hasjrel or x.opcode in dis.hasjabs:
            return []
        depth += dis.stack_effect(x.opcode, x.arg if x.opcode >= dis.HAVE_ARGUMENT else None)
        body.append(x)
        if depth == 1:
            last = len(body)
    return body[:last] if last > 0 else []


def _call_offset(code: CodeType) -> int:
    """The offset of ``code``'s first call (for the doctest)."""
    return next(x.offset for x in dis.get_instructions(code) if x.opname == "CALL")
