"""The PyTorch engines: three adapters and what they share.

* :mod:`metrics.engines.torch.compile`: ``torch_compile``, torch.compile
  (Dynamo) watched from outside: graphs, recompile causes, graph breaks,
  executions, steps.
* :mod:`metrics.engines.torch.lazy`: ``torch_lazy``, the lazy-tensor core
  (TorchScript backend): its counters, ``mark_step`` timed.
* :mod:`metrics.engines.torch.xla`: ``torch_xla``, PyTorch/XLA on PJRT: its
  counters and metrics, compile analyses, step marks.

Shared by them: :class:`~metrics.engines.torch.context.TorchContext` (what
an engine's parts share: recorder, notes, patches, library paths),
:mod:`~metrics.engines.torch.syncs` (reads of tensor values on the host, per
user line), :mod:`~metrics.engines.torch.optim` (the
optimizer's steps) and :mod:`~metrics.engines.torch.devices` (CUDA or CPU
device records). Each adapter has a ``create(recorder,
explain_cache_misses=...)`` (:mod:`metrics.engines.registry` names them);
importing this package imports no torch, an adapter imports its engine.
"""

from __future__ import annotations

__all__ = ["compile", "lazy", "xla"]
