"""A torch program's own host work between its steps, per line of its loop.

charrnn (pytorch/tutorials' char_rnn_classification) builds each example
on the host between two ``backward()`` calls: ``random`` choices, a
``torch.zeros`` and a Python loop setting one element per letter, 7.5-10.6 %
of its loop; the steady step read "other 2.0 ms (100%)". In eager PyTorch
every op is host time; the step's own work is the model's forward
(``nn.Module.__call__``), ``backward()`` and the optimizer's step, measured
or bounded by the step itself. Everything else the training thread runs
between two steps at the user's lines (``torch.zeros``, tensor indexing,
``random``, a Python loop) is that line's host work.

The generic sampled intervals (:class:`metrics.engines.host_lines.HostLines`,
its cost bounds and rules: nothing in a forked child, an exception counted,
never raised) begin after the step (:mod:`~metrics.engines.torch.optim`'s
hooks: the first optimizer's step, or ``backward()`` while no optimizer has
stepped) and end at the step's next call from its line. Their ``work_codes``
are the model's forward, ``backward()`` (``Tensor.backward``,
``torch.autograd.grad``), every optimizer's step (``torch.optim``'s step
wrapper) and ``zero_grad()`` (a module's, an optimizer's): time under them
is the engine's, wherever it runs, and so is the rest of a line that called
one (``loss = model(x).pow(2).mean()``: the loss on the model's output). Time under this
hook's own code (a ``loss.item()`` read: :mod:`.syncs`; a DataLoader's batch:
:mod:`.loader`, both measured there) and under Dynamo and Inductor (a
compiled function's run) is the engine's too. Torch's other functions called
at a line (``model.zero_grad()``, ``torch.tensor``) are the line's, named.
``loops``: a line's time goes to the line of the loop's frame that called
it (``randomTrainingExample()`` at the loop's line, the function named),
the innermost frame of the step's stack.

Example:
    >>> lines = torch_host_lines(recorder.hook_failed)       # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import CodeType

from metrics.engines._frames import engine_dirs, frames_for, skip_prefixes
from metrics.engines.host_lines import HostLines

__all__ = ["torch_host_lines", "work_codes"]


def work_codes() -> tuple[CodeType, ...]:
    """The code objects whose time is the step's own work (see the module's
    docstring); each one found where this torch has it."""
    import torch

    found: list[object] = [
        torch.nn.Module.__dict__.get("__call__"), getattr(torch.nn.Module, "_call_impl", None),
        getattr(torch.Tensor, "backward", None), getattr(torch.autograd, "backward", None),
        getattr(torch.autograd, "grad", None), getattr(torch.nn.Module, "zero_grad", None),
        getattr(torch.optim.Optimizer, "zero_grad", None)]
    wrap = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    if wrap is not None:
        try:  # (its wrapper's code: one for every optimizer's step)
            found.append(wrap(lambda *a, **k: None))
        except Exception:  # noqa: BLE001 - another torch: the optimizer's hook still ends it
            pass
    out = []
    for f in found:
        f = getattr(f, "__wrapped__", f)  # (torch.autograd.backward: this hook's wrapper)
        code = getattr(f, "__code__", None)
        if isinstance(code, CodeType):
            out.append(code)
    return tuple(out)


def torch_host_lines(on_error: Callable[[str, BaseException], None]) -> HostLines:
    """The sampled intervals of a torch program's host work between steps."""
    import torch

    root = os.path.dirname(os.path.abspath(torch.__file__))
    compiled = tuple(os.path.join(root, d) + os.sep for d in ("_dynamo", "_inductor", "_functorch"))
    return HostLines(frames_for(skip_prefixes()), engine_dirs() + compiled, None,
                     on_error=on_error, work_codes=work_codes(), loops=True)
