r"""Dynamo's guard failures (why torch.compile recompiled a frame) as causes:
argument, before and after.

Dynamo checks every cached graph of a frame and explains each failure in a
line (measured on torch 2.13): ``tensor 'x' size mismatch at index 0.
expected 4, actual 8``, ``tensor 'x' dtype mismatch. expected Float, actual
Double``, ``GLOBAL_STATE changed: grad_mode``, ``L['n'] == 2`` (a Python
number compiled in), ``len(L['xs']) == 2``, ``___check_obj_id(...)``, ``Cache line invalidated
because L['self'] got deallocated`` (a new object in the place of the one
the graph was compiled for: a new optimizer), each
after a compile id (``0/0: ``) and before ``# source  # file:line``. Sizes
become full types (``f32[4,3] -> f32[8,3]``): before, the type the failing
graph was compiled for (:class:`TypesByCompile`); after, the recompiled
graph's own input type with the failing dimension at the size the guard saw
(``i64[8,128] -> i64[1,s1]`` for a batch-1 generation whose sequence
dimension Dynamo made dynamic, never the old type with one size swapped:
``i64[1,128]`` where the input was ``[1,4]``); Python numbers' new values are
read off the frame (:func:`frame_values`). Each cause is typed: its
:class:`~tpu_info.contract.cause_kinds.CauseKind`, the guard that failed
(``guard``), the dimension (``dim``); the advice is the views'.

Example:
    >>> c = parse_recompile_reason(
    ...     "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 8", 0.0, "t.py:9",
    ...     {"x": "f32[4,3]"})
    >>> c.argument, c.before, c.after, str(c.kind), c.guard, c.dim
    ('x', 'f32[4,3]', 'f32[8,3]', 'batch_size', 'size', 0)
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING

from tpu_info.contract.cause_kinds import CauseKind
from tpu_info.contract.model import FIRST_CALL, RecompileCause

if TYPE_CHECKING:
    import torch

COMPILE_ID = re.compile(r"^\s*\[?\d+/\d+\]?:\s*")
# tensor 'x' size mismatch at index 0. expected 4, actual 8 (and dtype, rank,
# stride, requires_grad, device index, dispatch key set).
_TENSOR = re.compile(
    r"^tensor '(?P<arg>[^']+)' (?P<what>size|stride|dtype|rank|requires_grad|device index"
    r"|dispatch key set) mismatch(?: at index (?P<i>\d+))?[.:]? expected (?P<exp>.+?)"
    r"(?:, actual (?P<act>.+))?$")
_GLOBAL = re.compile(r"^GLOBAL_STATE changed: (?P<what>.+)$")
# The object a cache entry was specialized on was freed (a new optimizer made
# for a compiled step): "Cache line invalidated because L['self'] got deallocated".
_FREED = re.compile(r"^Cache line invalidated because (?P<src>.+?) got deallocated")
_ID = re.compile(r"___check_(?P<what>obj|type)_id\((?P<src>[^,]+),")
_VALUE_GUARD = re.compile(r"^(?P<len>len\()?(?P<src>[^=()]+?)\)? == (?P<val>\S+)$")
_GUARD_COMMENT = re.compile(r"\s+#.*$")
# A dynamic dimension's guard: ``16 <= x.size()[0]``, ``idx.size()[1] != 64``;
# a slice's ``2 <= x.storage_offset()``.
_SYMBOLIC = re.compile(r"(?P<src>[\w\[\]'.]+?)\.(?:size\(\)\[(?P<dim>\d+)\]|"
                       r"(?P<offset>storage_offset)\(\))")
_BOUND = re.compile(r"(?:^(?P<lo>-?\d+) (?P<lop><=|<|==|!=) )|(?: (?P<hop><=|<|>=|>|==|!=) "
                    r"(?P<hi>-?\d+)$)")
_TENSOR_KINDS = {"size": CauseKind.SHAPE_DIM, "stride": CauseKind.STRIDE,
                 "dtype": CauseKind.DTYPE, "rank": CauseKind.RANK,
                 "requires_grad": CauseKind.REQUIRES_GRAD}
_SCALARS = (bool, int, float)
_MAX_COMPILES = 512  # compile ids whose input types are kept


def source_name(source: str) -> str:
    """Dynamo's source string -> the user's spelling: ``L['x']`` -> ``x``,
    ``L['self']._modules['fc']._parameters['weight']`` -> ``self.fc.weight``."""
    s = re.sub(r"^[LG]\['([^']+)'\]", r"\1", source)
    s = re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", s)
    return s


# The order Dynamo checks a tensor's properties in (its TensorCheck), after
# the global state, which it checks before any argument: an entry that failed
# on a later check of the same argument passed the earlier ones.
_CHECK_ORDER = {"GLOBAL_STATE": 0, "dispatch key set": 1, "dtype": 2, "device index": 3,
                "requires_grad": 4, "rank": 5, "size": 6, "stride": 7}
_LATER = len(_CHECK_ORDER)  # value and symbolic guards: after the tensor checks


def _check(reason: str) -> tuple[str | None, int]:
    """A guard failure's argument (None: global state) and its place in
    Dynamo's check order."""
    text = guard_text(reason)
    if _GLOBAL.match(text):
        return None, 0
    if m := _TENSOR.match(text):
        return m.group("arg"), _CHECK_ORDER.get(m.group("what"), _LATER)
    if m := _SYMBOLIC.search(text):
        return source_name(m.group("src")), _LATER
    return "", _LATER


def choose_reason(reasons: list[str]) -> str:
    """The guard failure that explains a recompile, out of one per cached
    graph (each entry reports the first of its checks that failed). A
    failure is not what is new when another entry failed on a later check
    of the same argument (global state: of any), since that entry passed
    it: a discriminator's short last batch fails ``requires_grad`` on the
    entry compiled for a model output and ``size`` on the entries compiled
    for plain data, so the new thing is the size. The first failure no
    other entry got past; else the first."""
    checks = [_check(r) for r in reasons]
    for i, (arg, order) in enumerate(checks):
        passed = any(j != i and o > order and (arg is None or a == arg)
                     for j, (a, o) in enumerate(checks))
        if not passed:
            return reasons[i]
    return reasons[0]


def guard_text(reason: str) -> str:
    """A guard failure's first line without its compile id and Dynamo's
    trailing ``# source  # file:line`` comment."""
    first = reason.strip().splitlines()[0] if reason.strip() else reason
    return _GUARD_COMMENT.sub("", COMPILE_ID.sub("", first)).strip()


def parse_recompile_reason(reason: str, now: float, location: str | None,
                           before_types: dict[str, str] | None = None,
                           values: dict[str, str] | None = None,
                           after_types: dict[str, str] | None = None) -> RecompileCause:
    """One guard-failure line -> a typed cause (``guard`` names Dynamo's check);
    ``before_types`` maps argument names to the type the failing graph was
    compiled for (``f32[4,3]``), ``after_types`` to the type the recompiled
    graph was made for (``f32[1,s0]``), ``values`` the Python numbers (and
    lengths) the frame was called with this time. No reason: the frame's
    first compile."""
    if not reason:
        return RecompileCause(now, FIRST_CALL, location, kind=CauseKind.FIRST_CALL)
    text = guard_text(reason)
    cause = RecompileCause(time_unix=now, description=text, location=location,
                           kind=CauseKind.OTHER)
    if m := _TENSOR.match(text):
        return _tensor(cause, m, before_types, after_types)
    if m := _SYMBOLIC.search(text):
        return _symbolic(cause, m, text, values)
    if m := _GLOBAL.match(text):
        return replace(cause, kind=CauseKind.GLOBAL_STATE, guard="GLOBAL_STATE",
                       name=m.group("what").strip())
    if m := _FREED.match(text):
        return replace(cause, kind=CauseKind.OBJECT_REPLACED, guard="deallocated",
                       argument=source_name(m.group("src").strip()))
    if m := _ID.search(text):
        kind = CauseKind.TYPE_CHANGE if m.group("what") == "type" else CauseKind.OBJECT_IDENTITY
        return replace(cause, kind=kind, guard=f"___check_{m.group('what')}_id",
                       argument=m.group("src").strip())
    if m := _VALUE_GUARD.match(text):
        arg, val = source_name(m.group("src").strip()), m.group("val")
        key = f"len({arg})" if m.group("len") else arg
        new = (values or {}).get(key)
        if m.group("len"):
            kind, name = CauseKind.SEQUENCE_LENGTH, ""
        elif val in ("True", "False"):
            # A bool has one other value; `.training` is a module's train/eval mode.
            new = new or str(val == "False")
            kind = CauseKind.MODULE_MODE if arg.endswith(".training") else CauseKind.PYTHON_FLAG
            name = "bool"
        else:
            kind = CauseKind.PYTHON_NUMBER
            name = "float" if "." in val or "." in (new or "") else "int"
        return replace(cause, kind=kind, guard="len" if m.group("len") else "==",
                       argument=arg, before=val, after=new, name=name)
    if "ID_MATCH" in text:
        return replace(cause, kind=CauseKind.OBJECT_IDENTITY)
    return cause


def _symbolic(cause: RecompileCause, m: re.Match[str], text: str,
              values: dict[str, str] | None) -> RecompileCause:
    """A guard on a dynamic dimension (``16 <= x.size()[0]``: the code
    branched on it, or Dynamo specialized a bound) or on a slice's storage
    offset: the dimension, the bound (``before``), the size this call had."""
    arg = source_name(m.group("src"))
    if m.group("offset"):
        return replace(cause, kind=CauseKind.SYMBOLIC_SHAPE, guard="symbolic", argument=arg,
                       name="storage_offset", before=text)
    dim = int(m.group("dim"))
    shape = (values or {}).get(f"{arg}.shape", "").split(",")
    after = shape[dim] if dim < len(shape) and shape[dim] else None
    bound = next((b.group("lo") or b.group("hi") for b in _BOUND.finditer(text)), None)
    return replace(cause, kind=CauseKind.SYMBOLIC_SHAPE, guard="symbolic", argument=arg,
                   dim=dim, name="size", before=bound, after=after)


def _tensor(cause: RecompileCause, m: re.Match[str], before_types: dict[str, str] | None,
            after_types: dict[str, str] | None) -> RecompileCause:
    """A tensor guard: the property that changed, the dimension, before and
    after (sizes as full types where the failing graph's types are known:
    after, the recompiled graph's type of the same rank where it is known,
    with the failing dimension at the size the guard saw)."""
    arg, what, exp, act = m.group("arg"), m.group("what"), m.group("exp"), m.group("act")
    dim = int(m.group("i")) if m.group("i") is not None else None
    kind = _TENSOR_KINDS.get(what, CauseKind.TENSOR_PROPERTY)
    if what == "dispatch key set" and ("Autograd" in exp) != ("Autograd" in (act or "")):
        # A tensor made under torch.inference_mode() has no autograd keys.
        return replace(cause, kind=CauseKind.INFERENCE_MODE, guard=what, argument=arg,
                       name="inference_mode",
                       before="inference tensor" if "Autograd" not in exp else "normal tensor",
                       after="inference tensor" if "Autograd" not in (act or "") else
                       "normal tensor")
    if what == "size" and dim == 0:
        kind = CauseKind.BATCH_SIZE
    before, after = exp, act
    old = (before_types or {}).get(arg)
    dims = _dims(old) if old else None
    if what == "size" and old and dims is not None and dim is not None and dim < len(dims) \
            and act:
        made = (after_types or {}).get(arg) or ""
        new = _dims(made) if made else None
        if new is None or len(new) != len(dims):
            made, new = old, list(dims)
        new[dim] = act
        before, after = old, f"{made.split('[', 1)[0]}[{','.join(new)}]"
    return replace(cause, kind=kind, guard=what, dim=dim, argument=arg, before=before,
                   after=after, name=what if kind == CauseKind.TENSOR_PROPERTY else "")


def _dims(type_str: str) -> list[str] | None:
    if "[" not in type_str or not type_str.endswith("]"):
        return None
    inner = type_str.split("[", 1)[1][:-1]
    return inner.split(",") if inner else []


def frame_values(frame: FrameType) -> dict[str, str]:
    """The frame's Python numbers and sequence lengths, for value guards
    (``n == 2``, ``len(xs) == 2``): what they are on this call."""
    out: dict[str, str] = {}
    for name, value in frame.f_locals.items():
        if type(value) in _SCALARS:
            out[name] = repr(value)
        elif isinstance(value, _tensor_type()):
            out[f"{name}.shape"] = ",".join(map(str, value.shape))
        elif type(value) in (list, tuple, dict):
            out[f"len({name})"] = str(len(value))
    return out


def _tensor_type() -> type[torch.Tensor]:
    import torch  # loaded: this runs inside Dynamo

    return torch.Tensor


class TypesByCompile:
    """The input types each compile (``frame/attempt`` id) was made for, so a
    guard failure naming a compile id can say what the failing graph expected;
    the last :data:`_MAX_COMPILES` kept."""

    def __init__(self) -> None:
        self._types: OrderedDict[str, dict[str, str]] = OrderedDict()

    def remember(self, compile_id: str, types: dict[str, str]) -> None:
        d = self._types
        d[compile_id] = types
        d.move_to_end(compile_id)
        while len(d) > _MAX_COMPILES:
            d.popitem(last=False)

    def before(self, reason: str, compile_id: str | None) -> dict[str, str] | None:
        """The types of the graph whose guard ``reason`` failed: the compile id
        it names, else the latest compile of the same frame as ``compile_id``."""
        failed = COMPILE_ID.match(reason)
        key = failed.group(0).strip(" []:") if failed else None
        found = self._types.get(key) if key else None
        if found is None and self._types and compile_id:
            frame = str(compile_id).split("/")[0]
            for cid in reversed(self._types):
                if cid.split("/")[0] == frame:
                    return self._types[cid]
        return found
