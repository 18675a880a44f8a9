"""The patches of torch.compile and Dynamo's internals, and what each one
hands to :mod:`.record`.

Each wrapper looks up the installed context (:data:`.context.ACTIVE`) at
call time, so an uninstall restores attributes and clears the slot, and a
wrapper that outlives it (Dynamo keeps the patched callables it cached)
passes calls through.

Private APIs used (each behind a check that degrades the feature, never
crashes; the reasons go to the engine's ``degraded``):

* ``torch._dynamo.output_graph.OutputGraph.call_user_compiler`` (one
  backend compile; ``self.root_tx.f_code``, ``self.compiler_fn``,
  ``self.package``; placeholders' ``_dynamo_source`` and
  ``meta["example_value"]``)
* ``torch._dynamo.utils.log_compilation_event`` (each
  ``CompilationMetrics`` record; needs ``config.log_compilation_metrics``)
* ``torch._dynamo.symbolic_convert.InstructionTranslatorBase.log_graph_break``
  (one graph break; ``exc.gb_type``, ``exc.real_stack``)
* ``torch._dynamo.convert_frame.get_and_maybe_log_recompilation_reasons``
  (every cached graph's guard failure and the frame's locals)
* ``torch.fx._lazy_graph_module._LazyGraphModule`` (resolved before wrapping)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from metrics.engines.torch import syncs
from metrics.engines.torch.compile import eager, record
from metrics.engines.torch.compile.context import ACTIVE, CompileContext
from metrics.engines.torch.compile.guards import frame_values

if TYPE_CHECKING:
    from torch._dynamo.output_graph import OutputGraph
    from torch._dynamo.utils import CompilationMetrics
    from torch.fx import GraphModule

__all__ = ["hook_dynamo", "wrap_torch_compile"]


def hook_dynamo(ctx: CompileContext) -> None:
    """Puts the Dynamo hooks in (idempotent); imports ``torch._dynamo``."""
    with ctx.lock:
        if ctx.dynamo_hooked:
            return
        ctx.dynamo_hooked = True
        try:
            import torch._dynamo  # noqa: F401
            from torch._dynamo import config, output_graph, symbolic_convert
            from torch._dynamo import utils as dynamo_utils
        except Exception as e:  # noqa: BLE001 - a broken Dynamo must not break the program
            ctx.degraded.append(f"torch._dynamo unavailable: {e}")
            return
        hidden = syncs.hide_from_dynamo()
        if hidden is not None:
            ctx.degraded.append(hidden)
        patch = ctx.patches.apply
        patch(output_graph.OutputGraph, "call_user_compiler", _wrap_call_user_compiler,
              ("self", "gm", "example_inputs"))
        if patch(dynamo_utils, "log_compilation_event", _wrap_log_compilation_event):
            if not getattr(config, "log_compilation_metrics", True):
                ctx.degraded.append("torch._dynamo.config.log_compilation_metrics is off: "
                                    "no recompile causes, graphs recorded without them")
        patch(symbolic_convert.InstructionTranslatorBase, "log_graph_break",
              _wrap_log_graph_break, ("self", "code_options", "reason", "exc"))
        try:
            from torch._dynamo import convert_frame
        except Exception as e:  # noqa: BLE001
            ctx.degraded.append(f"torch._dynamo.convert_frame unavailable: {e}")
        else:
            # Every cached graph's guard failure (metrics keep only the first).
            patch(convert_frame, "get_and_maybe_log_recompilation_reasons",
                  _wrap_recompilation_reasons, ("cache_entries", "frame"))


def _wrap_call_user_compiler(original: Callable[..., Any]) -> Callable[..., Any]:
    def call_user_compiler(self: OutputGraph, gm: GraphModule, example_inputs: object,
                           *args: Any, **kwargs: Any) -> Any:
        ctx = ACTIVE.ctx
        if ctx is None:
            return original(self, gm, example_inputs, *args, **kwargs)
        start = time.perf_counter_ns()
        fn = original(self, gm, example_inputs, *args, **kwargs)
        return record.backend_compiled(ctx, self, gm, fn, time.perf_counter_ns() - start)

    return call_user_compiler


def _wrap_log_compilation_event(original: Callable[..., Any]) -> Callable[..., Any]:
    def log_compilation_event(metrics: CompilationMetrics, *args: Any, **kwargs: Any) -> Any:
        ctx = ACTIVE.ctx
        if ctx is not None:
            record.compilation_metrics(ctx, metrics)
        return original(metrics, *args, **kwargs)

    return log_compilation_event


def _wrap_log_graph_break(original: Callable[..., Any]) -> Callable[..., Any]:
    def log_graph_break(self: object, code_options: object, reason: object,
                        exc: BaseException | None, *args: Any, **kwargs: Any) -> Any:
        ctx = ACTIVE.ctx
        new = ctx is not None and not getattr(exc, "logged", False)
        out = original(self, code_options, reason, exc, *args, **kwargs)
        if new and ctx is not None:
            record.graph_break(ctx, self, reason, exc)
        return out

    return log_graph_break


def _wrap_recompilation_reasons(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_and_maybe_log_recompilation_reasons(cache_entries: object, frame: FrameType,
                                                *args: Any, **kwargs: Any) -> Any:
        reasons = original(cache_entries, frame, *args, **kwargs)
        ctx = ACTIVE.ctx
        if ctx is not None and reasons:
            try:
                ctx.thread.reasons = (list(reasons), frame_values(frame))
            except Exception as e:  # noqa: BLE001
                ctx.failed("torch_compile.reasons", e)
        return reasons

    return get_and_maybe_log_recompilation_reasons


def wrap_torch_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` hooking Dynamo on its first call, and timing what it
    returns once Dynamo gives up on that frame (:mod:`.eager`)."""
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's own name
        ctx = ACTIVE.ctx
        if ctx is not None:
            hook_dynamo(ctx)
        out = original(*args, **kwargs)
        model = args[0] if args else kwargs.get("model")
        if model is None:  # torch.compile(backend=...) used as a decorator factory
            return eager.time_decorated(out) if callable(out) else out
        return eager.time_compiled(model, out)

    return compile
