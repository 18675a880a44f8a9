"""What kind of change made a graph compile again: the typed half of a
:class:`~tpu_info.contract.model.RecompileCause`.

Each engine names the kind where it knows it (the JAX hook from JAX's
explanation, the torch.compile hook from Dynamo's guard failure, the torch_xla
hook from the step a new graph came in) and fills the fields that say what
changed: ``argument``, ``before``/``after``, ``dim`` (a shape's dimension),
``name`` (a config option, context, global state or tensor property),
``guard`` (the torch.compile guard that failed), ``sync``/``syncs_after``
(torch_xla). The views turn a kind into words and advice
(:mod:`tpu_info.views.causes`); a cause from an older hook carries only
its description and reads as :attr:`CauseKind.UNKNOWN`.

The helpers here are pure string functions both sides use on the type
strings the hooks record (``f32[8@d,3] (weak)``).

Example:
    >>> type_change("f32[8,3]", "f32[5,3]")
    (<CauseKind.BATCH_SIZE: 'batch_size'>, 0)
    >>> type_change("f32[8,3]", "f32[8,4]")
    (<CauseKind.SHAPE_DIM: 'shape_dim'>, 1)
    >>> static_kind("<function relu at 0x1>", "<function relu at 0x2>")
    <CauseKind.FUNCTION_RECREATED: 'function_recreated'>
"""

from __future__ import annotations

import enum


class CauseKind(enum.StrEnum):
    """The kinds of change the hooks tell apart (the values travel on the wire)."""

    UNKNOWN = "unknown"  # an older hook's cause: only its description
    OTHER = "other"  # the engine explained it in words no kind fits
    FIRST_CALL = "first_call"
    # An array argument's type.
    BATCH_SIZE = "batch_size"  # dimension 0 (the views tell a short last batch apart)
    SHAPE_DIM = "shape_dim"  # another dimension: ``dim``
    RANK = "rank"
    DTYPE = "dtype"
    WEAK_TYPE = "weak_type"
    SHARDING = "sharding"
    DEVICE = "device"  # the same types, placed on another device
    # Static arguments and containers (JAX).
    STATIC_VALUE = "static_value"
    STATIC_FUNCTION = "static_function"  # another function passed
    FUNCTION_RECREATED = "function_recreated"  # the same function, a new object of it
    PYTREE = "pytree"
    # Around the call.
    CONFIG = "config"  # a jax_* option: ``name``
    CONTEXT = "context"  # a tracing context (a mesh...): ``name``
    GLOBAL_STATE = "global_state"  # torch's grad mode, autocast...: ``name``
    # torch.compile guards (``guard``: Dynamo's word for the property).
    REQUIRES_GRAD = "requires_grad"
    STRIDE = "stride"
    TENSOR_PROPERTY = "tensor_property"  # device index, dispatch key set: ``name``
    TYPE_CHANGE = "type_change"
    OBJECT_IDENTITY = "object_identity"
    # The object a graph was compiled for was freed and a new one came in its
    # place (Dynamo: "Cache line invalidated because L['self'] got deallocated"):
    # an optimizer, model or module made anew. ``argument``: the object.
    OBJECT_REPLACED = "object_replaced"
    SEQUENCE_LENGTH = "sequence_length"
    PYTHON_FLAG = "python_flag"  # a Python bool compiled in
    MODULE_MODE = "module_mode"  # an nn.Module's ``training``: model.train() vs model.eval()
    PYTHON_NUMBER = "python_number"  # a Python int or float compiled in
    # A dynamic dimension's guard (``16 <= x.size()[0]``): ``dim``, the bound in
    # ``before``, this call's size in ``after``; a slice's storage offset: ``name``.
    SYMBOLIC_SHAPE = "symbolic_shape"
    INFERENCE_MODE = "inference_mode"  # a tensor made under torch.inference_mode() or not
    # torch_xla.
    XLA_WARM_UP = "xla_warm_up"  # a new graph the sync right after the last one
    XLA_NEW_GRAPH = "xla_new_graph"  # a new graph later: new input shapes
    XLA_VALUE_ACCESS = "xla_value_access"  # a tensor's value read before the sync
    # ... read in a step closure (xm.add_step_closure: after the sync); its own small graph
    XLA_CLOSURE_READ = "xla_closure_read"


def kind_of(value: str | None) -> str:
    """A kind from the wire: the :class:`CauseKind`; one this side does not
    know (a newer hook's) kept as its string, so it travels on unchanged (the
    views read it as unknown); none at all (an older hook's) is unknown."""
    try:
        return CauseKind(value or CauseKind.UNKNOWN)
    except ValueError:
        return str(value)


def shape_of(t: str | None) -> tuple[str, list[str]] | None:
    """``f32[8@d,3] (weak)`` -> ``('f32', ['8', '3'])`` (mesh axes dropped);
    None for what is not an array type."""
    if not t or "[" not in t:
        return None
    dtype, _, rest = t.partition("[")
    if not (dtype.isalnum() and dtype[:1].isalpha()) or "]" not in rest:
        return None
    dims = rest[:rest.index("]")]
    return dtype, ([d.partition("@")[0] for d in dims.split(",")] if dims else [])


def type_change(before: str | None, after: str | None) -> tuple[CauseKind, int | None] | None:
    """What changed between two array types, and the dimension where a shape
    changed; None where they are not both array types, or are the same."""
    b, a = shape_of(before), shape_of(after)
    if b is None or a is None:
        return None
    if b[0] != a[0]:
        return CauseKind.DTYPE, None
    if b[1] == a[1]:
        assert before is not None and after is not None
        if before.endswith("(weak)") != after.endswith("(weak)"):
            return CauseKind.WEAK_TYPE, None
        return (CauseKind.SHARDING, None) if before != after else None
    if len(b[1]) != len(a[1]):
        return CauseKind.RANK, None
    dim = next(i for i, (x, y) in enumerate(zip(b[1], a[1], strict=True)) if x != y)
    if dim == 0:  # the batch dimension alone, else more than one dimension changed
        return (CauseKind.BATCH_SIZE, 0) if b[1][1:] == a[1][1:] else (CauseKind.RANK, None)
    return CauseKind.SHAPE_DIM, dim


# How Python shows a function (a static argument's recorded value): a def or
# lambda, a jitted function, a partial, a bound or built-in method.
_FUNCTION_STARTS = ("<function ", "<PjitFunction ", "<bound method ", "<built-in function ",
                    "<built-in method ", "<method ", "functools.partial(")


def is_function(value: str | None) -> bool:
    """``value`` (a static argument's value as recorded) is a function's repr
    (a custom_jvp/custom_vjp function too: ``jax.nn.relu``)."""
    if not value:
        return False
    if value.startswith(_FUNCTION_STARTS):
        return True
    head, _, rest = value[1:].partition(" ")
    return (value.startswith("<") and rest.startswith("object at ")
            and head.rsplit(".", 1)[-1] in ("custom_jvp", "custom_vjp"))


def without_addresses(value: str) -> str:
    """``<function f at 0x7f..>`` -> ``<function f>``: the object's address dropped."""
    out, rest = [], value
    while (i := rest.find(" at 0x")) >= 0:
        j = i + len(" at 0x")
        while j < len(rest) and rest[j] in "0123456789abcdefABCDEF":
            j += 1
        out.append(rest[:i])
        rest = rest[j:]
    return "".join(out) + rest


def static_kind(before: str | None, after: str | None) -> CauseKind:
    """A static argument's change: another function, the same function made
    anew (at another address), or another value. A value cut short (``...``,
    the hook's bound on a value's length) cannot say it is the same function."""
    if is_function(before) and is_function(after):
        assert before is not None and after is not None
        if without_addresses(before) == without_addresses(after) and not after.endswith("..."):
            return CauseKind.FUNCTION_RECREATED
        return CauseKind.STATIC_FUNCTION
    return CauseKind.STATIC_VALUE


# torch_xla's first steps compile their own graphs (step 0 has no optimizer state).
WARM_UP_STEPS = 2


def xla_warm_up(sync: int, syncs_after: int | None) -> bool:
    """A torch_xla new graph at sync ``sync``, ``syncs_after`` syncs after the
    last new graph at its line: right after it (or, where that is not known,
    in the first syncs) it is warm-up, later the inputs changed."""
    return syncs_after == 0 if syncs_after is not None else sync <= WARM_UP_STEPS
