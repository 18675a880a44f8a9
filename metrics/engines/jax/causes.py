r"""JAX's recompile explanations, and the recompiles it does not explain, in
one form: ``argument 'NAME' changed OLD -> NEW``, with the kind of change
typed (:class:`~tpu_info.contract.cause_kinds.CauseKind`: a dimension, the
dtype, a static value, a config option...; the advice for it is the views').

JAX's ``jax_explain_cache_misses`` text has a body per kind of change
(measured on JAX 0.10.2):

* input types (shape, dtype, weak type, sharding): ``* at lr, now
  f32[]{weak_type=False} and before f32[]{weak_type=True}https://docs...``
  (the doc URL glued on with no space);
* input pytree (static arguments, dict keys, list lengths, Python types):
  ``* at input path [1]['mode'], now <class '...Static'> with pytree
  metadata Static(val=3) and before ..., so ...``; the path indexes the
  call's ``(args, kwargs)``, mapped here to the function's parameter names;
* tracing context (config options, meshes): ``* jax_default_matmul_precision
  differs: now highest and before None``;
* ``never seen function``: the first call, not a recompile.

A committed array moved to another device, or resharded over the same
devices (a mesh without explicit axes: made with ``P()``, returned by the
step as ``P('model',)``), recompiles with no explanation at all (the tracing
cache hits, the lowering cache misses): :class:`LoweringHistory` compares
each lowering's input shardings with the function's previous lowering and
names the argument that moved (a device move) or was resharded (a sharding
change).

Example:
    >>> fn, cause = parse_cache_miss(
    ...     "TRACING CACHE MISS at t.py:9 (f):\n  for f defined at t.py:3\n"
    ...     "  different input types:\n  * at x, now f32[4] and before f32[3]", 0.0)
    >>> fn, cause.description, cause.location, str(cause.kind), cause.dim
    ('f', "argument 'x' changed f32[3] -> f32[4]", 't.py:9', 'batch_size', 0)
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from tpu_info.contract.cause_kinds import CauseKind, static_kind, type_change
from tpu_info.contract.model import FIRST_CALL, RecompileCause

_MISS_RE = re.compile(r"TRACING CACHE MISS at (?P<loc>.+?:\d+)")
_FUNC_RE = re.compile(r"(?:for|^\s*)\s*(?P<name>\S+?)(?: id=\d+)? defined at", re.M)
_URL_RE = re.compile(r"https?://\S+")
_TYPE_RE = re.compile(r"^\s*\* at (?P<arg>.+?), now (?P<new>.+?) and before (?P<old>.+?)\s*$",
                      re.M)
_TREE_RE = re.compile(r"^\s*\* at input path (?P<path>.+?), now (?P<new>.+?) and before "
                      r"(?P<old>.+?), so (?P<why>.+?)\s*$", re.M)
_CONTEXT_RE = re.compile(r"^\s*\* (?P<name>[\w ]+?) differs: now (?P<new>.*?) and before "
                         r"(?P<old>.*?)\s*$", re.M)
_STATIC_RE = re.compile(r"Static\(val=(?P<val>.*)\)$")
_CLASS_RE = re.compile(r"^<class '(?P<cls>[^']+)'>(?: with (?P<rest>.+))?$")
_LENGTH_RE = re.compile(r"^(?P<cls>\w+) of length (?P<n>\d+)$")
_CHILDREN_RE = re.compile(r"^(?P<n>\d+) child(?:ren)?$")
# f32[8@d]({Explicit: ('d',)}){weak_type=True}: type, sharding part, weak flag.
_AVAL_RE = re.compile(r"^(?P<type>[^({]+?)(?P<sharding>\(\{.*\}\))?"
                      r"(?:\{weak_type=(?P<weak>True|False)\})?$")
_MESH_RE = re.compile(r"(?:Abstract)?Mesh\((?P<axes>'[^']+': \d+(?:, '[^']+': \d+)*)"
                      r"(?:[^()]|\([^()]*\))*\)")
_PATH_RE = re.compile(r"^\[(?P<part>[01])\]\[(?P<key>\d+|'[^']*'|\"[^\"]*\")\](?P<rest>.*)$")
_LONG = 60  # longest value shown as it is (static values, pytree metadata)

Namer = Callable[[str], str]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _LONG else text[:_LONG - 3] + "..."


def quoted(name: str) -> str:
    """``'x'``; a leaf path as it is: ``params['layer']['w']``."""
    return name if "[" in name or "'" in name else f"'{name}'"


def _also(others: Sequence[str]) -> str:
    """`` (also 'y')``, `` (also 'y', 'z' and 3 more)``: the other changes, counted."""
    if not others:
        return ""
    shown = ", ".join(quoted(o) for o in others[:2])
    return f" (also {shown}{f' and {len(others) - 2} more' if len(others) > 2 else ''})"


def param_path(fun: Callable[..., object] | None, path: str) -> str:
    """An input path of a jitted call -> the parameter it names: ``[0][1]`` ->
    ``mode`` (the second positional parameter of ``fun``), ``[1]['mode']`` ->
    ``mode``, ``[0][0]['layer']`` -> ``params['layer']``; the path itself when
    the signature cannot say (no function, a builtin, more positions than
    parameters)."""
    m = _PATH_RE.match(path)
    if m is None:
        return path
    key, rest = m.group("key"), m.group("rest")
    if m.group("part") == "1":
        return key.strip("'\"") + rest
    if fun is None:
        return path
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return path
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p.name for p in params if p.kind in kinds]
    i = int(key)
    if i < len(positional):
        return positional[i] + rest
    star = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    return f"{star}[{i - len(positional)}]{rest}" if star else path


def _avals(old: str, new: str) -> tuple[str, str]:
    """Two of JAX's type strings, cleaned: the sharding part only where it
    differs, ``{weak_type=True}`` as `` (weak)``, ``{weak_type=False}`` dropped."""
    mo, mn = _AVAL_RE.match(old.strip()), _AVAL_RE.match(new.strip())
    if mo is None or mn is None:
        return _short(old), _short(new)
    keep = mo.group("sharding") != mn.group("sharding")

    def one(m: re.Match[str]) -> str:
        s = m.group("type").strip()
        if keep and m.group("sharding"):
            s += m.group("sharding")
        return s + (" (weak)" if m.group("weak") == "True" else "")

    return one(mo), one(mn)


def _node(thing: str) -> str:
    """A pytree node as JAX prints it -> short words: ``dict('a', 'b')``,
    ``list of 3``, ``tuple``, ``leaf``, ``None``."""
    thing = thing.strip()
    if thing == "pytree leaf":
        return "leaf"
    if m := _LENGTH_RE.match(thing):
        return f"{m.group('cls')} of {m.group('n')}"
    m = _CLASS_RE.match(thing)
    if m is None:
        return _short(thing)
    cls = m.group("cls").rsplit(".", 1)[-1]
    cls = "None" if cls == "NoneType" else cls
    rest = m.group("rest") or ""
    if n := _CHILDREN_RE.match(rest):
        return f"{cls} of {n.group('n')}"
    if rest.startswith("pytree metadata "):
        meta = rest[len("pytree metadata "):]
        return _short(f"{cls}{meta}" if meta.startswith("(") else f"{cls}({meta})")
    return cls


def _context_value(value: str) -> str:
    """Meshes as ``Mesh('d': 2)``, not their full repr."""
    return _short(_MESH_RE.sub(lambda m: f"Mesh({m.group('axes')})", value))


def _types(body: str) -> tuple[str, RecompileCause] | None:
    changed = list(_TYPE_RE.finditer(body))
    if not changed:
        return None
    first = changed[0]
    name = first.group("arg")
    old, new = _avals(first.group("old"), first.group("new"))
    text = f"argument {quoted(name)} changed {old} -> {new}"
    kind, dim = type_change(old, new) or (CauseKind.OTHER, None)
    return text + _also([m.group("arg") for m in changed[1:]]), RecompileCause(
        0.0, "", None, name, old, new, kind=kind, dim=dim)


def _tree(body: str, names: Namer) -> tuple[str, RecompileCause] | None:
    changed = list(_TREE_RE.finditer(body))
    if not changed:
        return None
    first = changed[0]
    name = names(first.group("path"))
    others = [names(m.group("path")) for m in changed[1:]]
    so, sn = _STATIC_RE.search(first.group("old")), _STATIC_RE.search(first.group("new"))
    if so and sn:
        old, new = _short(so.group("val")), _short(sn.group("val"))
        text = f"static argument {quoted(name)} changed {old} -> {new}"
        kind = static_kind(old, new)
    else:
        old, new = _node(first.group("old")), _node(first.group("new"))
        text = f"argument {quoted(name)} changed {old} -> {new}"
        kind = CauseKind.PYTREE  # the containers around the arrays
    return text + _also(others), RecompileCause(0.0, "", None, name, old, new, kind=kind)


def _context(body: str) -> tuple[str, RecompileCause] | None:
    changed = [m for m in _CONTEXT_RE.finditer(body)]
    if not changed:
        return None
    first = changed[0]
    name = first.group("name")
    old, new = _context_value(first.group("old")), _context_value(first.group("new"))
    if name.startswith("number of"):  # JAX's own options were added or removed
        return (f"tracing context changed ({name}: {old} -> {new})",
                RecompileCause(0.0, "", None, None, old, new, kind=CauseKind.CONTEXT, name=name))
    text = f"{name} changed {old} -> {new}" + _also([m.group("name") for m in changed[1:]])
    kind = CauseKind.CONFIG if name.startswith("jax_") else CauseKind.CONTEXT
    return text, RecompileCause(0.0, "", None, None, old, new, kind=kind, name=name)


def parse_cache_miss(message: str, now: float, names: Namer | None = None,
                     ) -> tuple[str | None, RecompileCause]:
    """One ``jax_explain_cache_misses`` record -> (function name, cause in
    clean words). ``names`` maps an input path to the parameter it names
    (see :func:`param_path`); without it paths are shown as they are."""
    message = _URL_RE.sub("", message)
    loc = _MISS_RE.search(message)
    func = _FUNC_RE.search(message)
    location = loc.group("loc") if loc else None
    fn = func.group("name") if func else None
    if "never seen function" in message:
        return fn, RecompileCause(now, FIRST_CALL, location, kind=CauseKind.FIRST_CALL)
    parsed = (_context(message) if "Tracing context" in message else None) or _tree(
        message, names or (lambda p: p)) or _types(message)
    if parsed is not None:
        text, c = parsed
        return fn, dataclasses.replace(c, time_unix=now, description=text, location=location)
    if "Debug info doesn't match" in message:
        text = "debug info changed (the function's argument names or source)"
    else:
        body = [ln.strip() for ln in message.splitlines()[1:]
                if ln.strip() and " defined at " not in ln and "previously seen" not in ln]
        text = _short("; ".join(body)) or "cache miss with no explanation"
    return fn, RecompileCause(now, text, location, kind=CauseKind.OTHER)


# --- recompiles JAX does not explain -----------------------------------------------


def placement(sharding: Any) -> str:  # a Sharding, an UnspecifiedValue or None
    """Where an input lives, in a few words: ``device 1``, ``uncommitted``,
    ``P('d',) over 2 devices``."""
    if sharding is None or type(sharding).__name__ == "UnspecifiedValue":
        return "uncommitted"
    try:
        devices = sharding.device_set
        spec = getattr(sharding, "spec", None)
        if len(devices) == 1:
            return f"device {next(iter(devices)).id}"
        return f"{spec if spec is not None else type(sharding).__name__} over " \
               f"{len(devices)} devices"
    except Exception:  # noqa: BLE001 - an exotic sharding: its own words
        return _short(str(sharding))


class LoweringHistory:
    """The input shardings each function was last lowered with, per input
    types, to name recompiles JAX does not explain: the same types with an
    input on another device (or committed before, uncommitted now), or
    resharded over the same devices, is a tracing-cache hit and a
    lowering-cache miss, so no explanation is logged."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._last: dict[Hashable, tuple[object, ...]] = {}

    def moved(self, key: Hashable, avals: Sequence[object], shardings: Sequence[object],
              arg_names: Sequence[str | None]) -> RecompileCause | None:
        """Remembers this lowering of function ``key``; the cause when it was
        lowered before for the same input types with inputs placed elsewhere
        (time and location are filled in by the caller)."""
        variant, now = (key, tuple(avals)), tuple(shardings)
        previous = self._last.pop(variant, None)
        if len(self._last) >= self._limit:
            self._last.pop(next(iter(self._last)))
        self._last[variant] = now
        if previous is None or len(previous) != len(now):
            return None
        moved = [i for i, (a, b) in enumerate(zip(previous, now, strict=True)) if not _same(a, b)]
        if not moved:
            return None

        def name(i: int) -> str:
            return (arg_names[i] if i < len(arg_names) else None) or f"#{i}"

        i = moved[0]
        old, new = placement(previous[i]), placement(now[i])
        also = _also([name(j) for j in moved[1:]])
        if old != new and _devices(previous[i]) == _devices(now[i]) is not None:
            # the same devices, another partition spec: resharded, not moved
            spec, over, devices = old.partition(" over ")
            was = spec if over and new.endswith(over + devices) else old
            return RecompileCause(0.0, f"argument {quoted(name(i))} changed sharding {was} -> "
                                  f"{new}{also}", None, name(i), old, new,
                                  kind=CauseKind.SHARDING)
        if old == new:  # same devices: the memory kind (device vs pinned_host) differs
            old, new = (f"{p} ({getattr(s, 'memory_kind', None)})"
                        for p, s in ((old, previous[i]), (new, now[i])))
            if old == new:
                return None
        return RecompileCause(0.0, f"argument {quoted(name(i))} moved {old} -> {new}{also}",
                              None, name(i), old, new, kind=CauseKind.DEVICE)


def _devices(sharding: Any) -> frozenset[object] | None:
    """The devices a committed input is spread over; None where it is uncommitted
    or the sharding cannot say."""
    if sharding is None or type(sharding).__name__ == "UnspecifiedValue":
        return None
    try:
        return frozenset(sharding.device_set)
    except Exception:  # noqa: BLE001 - an exotic sharding
        return None


def _same(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return a is b
