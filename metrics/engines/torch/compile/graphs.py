"""What a graph Dynamo hands to a backend reads as (:class:`Graph`,
:func:`describe`): its hash, its name, its input types (``f32[8,3]``, short
dtype names as JAX's), and the callable to wrap once a lazily recompiled
GraphModule is resolved.

Example:
    >>> short_dtype("torch.float32")
    'f32'
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any

from metrics.engines.torch.compile.breaks import Function, display_name, function_of
from metrics.engines.torch.compile.eager import is_partial
from metrics.engines.torch.compile.guards import source_name

if TYPE_CHECKING:
    from torch._dynamo.output_graph import OutputGraph
    from torch.fx import GraphModule

__all__ = ["Graph", "describe", "short_dtype", "tensor_type", "resolve_lazy"]

_DTYPES = {
    "float32": "f32", "float": "f32", "float64": "f64", "double": "f64",
    "float16": "f16", "half": "f16", "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "long": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool": "bool", "complex64": "c64", "complex128": "c128",
}


def short_dtype(dtype: object) -> str:
    """``torch.float32`` -> ``f32`` (JAX's short names), unknown ones as-is."""
    name = str(dtype).rsplit(".", 1)[-1]
    return _DTYPES.get(name, name)


def tensor_type(value: object) -> str | None:
    """``f32[8,3]`` for a tensor (symbolic sizes print as their symbol), else None."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    return f"{short_dtype(dtype)}[{','.join(str(d) for d in shape)}]"


def resolve_lazy(fn: Callable[..., Any]) -> Callable[..., Any]:
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


class Graph:
    """One graph a backend compiled: its hash, its name and the user's
    function it is part of; what its calls are folded by (hashable by
    identity: one object per compile)."""

    __slots__ = ("hash", "name", "signature", "types", "backend_ns", "qualname", "function",
                 "resume_line", "break_key", "grad", "partial")

    def __init__(self, graph_hash: str, code: CodeType, signature: tuple[str, ...],
                 types: dict[str, str], backend_ns: int, grad: bool = True) -> None:
        self.hash = graph_hash
        self.qualname: str = getattr(code, "co_qualname", code.co_name)
        self.name = display_name(self.qualname)
        # The user's function and the line this part resumes at (None: its start).
        self.function, self.resume_line = function_of(code)
        # The break this part follows (BreakGaps pairs its calls), None for the start.
        self.break_key: tuple[Function, int] | None = (
            None if self.resume_line is None else (self.function, self.resume_line))
        self.signature = signature
        self.types = types
        self.backend_ns = backend_ns
        # Compiled for calls with gradients on (Dynamo guards on grad mode: a
        # no_grad call runs a graph of its own): training, not evaluation.
        self.grad = grad
        # The compiled part of a frame whose rest runs eagerly (eager.outside_graphs).
        self.partial = is_partial(code)


def describe(output: OutputGraph, gm: GraphModule, backend_ns: int) -> Graph:
    """The graph Dynamo's ``output`` handed to the backend as ``gm``, which
    took ``backend_ns`` to compile. Its hash: sha256 over the backend's
    name, the FX code and every input's type (parameters and buffers count
    in the hash only, the signature lists the user's inputs)."""
    import torch

    code = output.root_tx.f_code
    backend = output.compiler_fn
    backend_name = (getattr(backend, "compiler_name", None)
                    or getattr(backend, "__name__", None) or type(backend).__name__)
    sig: list[str] = []
    types: dict[str, str] = {}
    hashed: list[str] = [str(backend_name), gm.code]
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        src = getattr(node, "_dynamo_source", None)
        src_name = source_name(str(src.name)) if src is not None else node.name
        t = tensor_type(value)
        hashed.append(f"{src_name}:{t if t is not None else type(value).__name__}")
        if t is None:
            continue  # SymInts: their symbols already show in the shapes
        if isinstance(value, torch.nn.Parameter) or "._parameters[" in str(
                getattr(src, "name", "")) or "._buffers[" in str(getattr(src, "name", "")):
            continue
        sig.append(f"{src_name}: {t}")
        types[src_name] = t
    digest = hashlib.sha256("\n".join(hashed).encode()).hexdigest()[:32]
    # Dynamo compiles under the calling frame's grad mode (a guard of the graph).
    return Graph(digest, code, tuple(sig), types, backend_ns, torch.is_grad_enabled())
