"""What a graph Dynamo hands to a backend reads as: short dtype names, the
input types (``f32[8,3]``), and the callable to wrap once a lazily
recompiled GraphModule is resolved.

Imports torch only inside functions that receive torch objects.

Example:
    >>> short_dtype("torch.float32")
    'f32'
"""

from __future__ import annotations

from typing import Any

_DTYPES = {
    "float32": "f32", "float": "f32", "float64": "f64", "double": "f64",
    "float16": "f16", "half": "f16", "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "long": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool": "bool", "complex64": "c64", "complex128": "c128",
}


def short_dtype(dtype: Any) -> str:
    """``torch.float32`` -> ``f32`` (JAX's short names), unknown ones as-is."""
    name = str(dtype).rsplit(".", 1)[-1]
    return _DTYPES.get(name, name)


def tensor_type(value: Any) -> str | None:
    """``f32[8,3]`` for a tensor (symbolic sizes print as their symbol), else None."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    return f"{short_dtype(dtype)}[{','.join(str(d) for d in shape)}]"


def resolve_lazy(fn: Any) -> Any:
    """What Dynamo does with a lazily recompiled GraphModule, done before a
    hook wraps the backend's callable (Dynamo's own check cannot see through
    the wrapper)."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return fn
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, _LazyGraphModule):
        _LazyGraphModule.force_recompile(fn)
        return fn
    if isinstance(owner, _LazyGraphModule) and getattr(fn, "__name__", "") == "_lazy_forward":
        _LazyGraphModule.force_recompile(owner)
        return owner.forward
    return fn
