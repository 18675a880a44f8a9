"""The notes :class:`~metrics.engines.torch.gaps.StepGaps` takes its gaps
from: rare calls patched at install, each noting ``(kind, the user's line,
its detail, now)`` with one append, and the ends of their work by time alone.

- ``Module.eval()`` and the user's ``model.train(False)`` (an evaluation
  begins; pytorch/tutorials' trainingyt validates after ``model.train(False)``):
  the outermost call only, once (``eval()`` calls ``train(False)``, and
  ``train()`` recurses into the children: a call inside another is not noted);
- the user's entry into a ``torch.no_grad()`` or ``torch.inference_mode()``
  block (pytorch/examples' super_resolution evaluates under ``no_grad`` with
  no ``model.eval()``), in either form: the ``with`` line, or for a decorated
  function (entered in torch's ``_contextlib`` wrapper) the first frame past
  torch's, the function's caller; only a user's frame counts (a library's
  block, ``clip_grad_norm_``'s, costs a grad-mode test, one frame and one
  dict look-up), only the outermost block (gradients were on), and never a
  line the fold found entered between every two steps (a hand-written SGD
  update, an EMA: :attr:`StepGaps.quiet`); its exit is noted by its time;
- ``torch.save`` (a checkpoint) and its return, by time;
- the user's ``model.train()`` after another note (the work's end), by time.

The notes' kinds and :class:`Note` are here; the fold is
:mod:`~metrics.engines.torch.gaps`'s. All return at once while Dynamo
traces (``torch.compiler.is_compiling()`` first: a frame walk would break
its graph); a failure is counted, never raised into the program.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any, NamedTuple

from metrics.engines._frames import ENGINE, USER, frames_for, user_line
from tpu_info.contract.diagnosis import SiteKind

if TYPE_CHECKING:
    from metrics.engines._patching import Patches
    from metrics.engines.torch.context import TorchContext
    from metrics.engines.torch.gaps import StepGaps

__all__ = ["CALL", "CHECKPOINT", "ENDS", "EVAL", "GRAD_ON", "NOGRAD", "SAVED", "TRAIN", "Note",
           "install_notes"]

# A note's kind: model.eval() (or the user's model.train(False)), a compiled
# graph's call with gradients off, the user's no_grad block, torch.save.
EVAL, CALL, CHECKPOINT = SiteKind.EVAL_MODE.value, SiteKind.CALL.value, SiteKind.SAVE.value
NOGRAD = SiteKind.NO_GRAD.value
# An eval note's detail ends with the grad mode the call ran under, if off.
INFERENCE_MODE, NO_GRAD = " under inference_mode", " under no_grad"
# The ends of work, by time (no site): the user's model.train() after a note
# (an evaluation's end), a noted no_grad block's exit (its line kept), a
# torch.save's return.
TRAIN, GRAD_ON, SAVED = "train_mode", "grad_on", "saved"
ENDS = frozenset({TRAIN, GRAD_ON, SAVED})
MAX_LINES = 4096  # the no_grad blocks' lines kept formatted


class Note(NamedTuple):
    """A call noted in the program: its kind, the user's line, when (monotonic ns)."""

    kind: str
    location: str
    via: str
    detail: str
    ns: int


def install_notes(gaps: StepGaps, patches: Patches, ctx: TorchContext) -> None:
    """Patches ``Module.eval``, ``Module.train``, ``torch.save`` and the
    ``no_grad`` and ``inference_mode`` blocks' ``__enter__`` and ``__exit__``
    to note into ``gaps.notes`` (restored with ``patches``)."""
    import torch
    import torch.utils._contextlib as contextlib_

    notes, clock, skip, quiet = gaps.notes, time.monotonic_ns, ctx.skip, gaps.quiet
    compiling, grad_on = torch.compiler.is_compiling, torch.is_grad_enabled
    kind = frames_for(skip).kind
    wrapper_file = contextlib_.__file__
    depth = [0]  # inside a noted eval() or train(): its own calls are not the user's
    block: list[Any] = [None, ""]  # the open no_grad block noted, if any, and its line
    lines: dict[tuple[CodeType, int], str] = {}

    def note(kind_: str, detail: str) -> bool:
        try:
            here = user_line(skip, 3)
            if here is not None:
                notes.append(Note(kind_, here.location, here.via, detail, clock()))
                gaps.noted()
                return True
        except Exception as e:  # noqa: BLE001 - a hook never raises into the program
            ctx.failed("torch.gaps", e)
        return False

    def grad_words() -> str:
        # (the grad mode it ran under: the advice is not to add it)
        return (INFERENCE_MODE if torch.is_inference_mode_enabled() else
                NO_GRAD if not grad_on() else "")

    def wrap_train(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def train(self_: Any, mode: bool = True) -> Any:
            if depth[0] or compiling():
                return original(self_, mode)
            depth[0] += 1
            try:
                if not mode:  # the user's model.train(False): an evaluation begins
                    note(EVAL, f"{type(self_).__name__}.train(False){grad_words()}")
                elif notes and notes[-1].kind != TRAIN:
                    # The end of the work noted before it, by its time alone
                    # (a loop that calls it every step and never evaluates
                    # notes nothing).
                    notes.append(Note(TRAIN, "", "", "", clock()))
                    gaps.noted()
            except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                ctx.failed("torch.gaps", e)
            try:
                return original(self_, mode)
            finally:
                depth[0] -= 1
        return train

    def wrap_eval(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def eval(self_: Any) -> Any:  # noqa: A001 - the method's own name
            if depth[0] or compiling():
                return original(self_)
            depth[0] += 1
            try:
                note(EVAL, f"{type(self_).__name__}.eval(){grad_words()}")
                return original(self_)
            finally:
                depth[0] -= 1
        return eval

    def wrap_save(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def save(*args: Any, **kwargs: Any) -> Any:
            noted = not compiling() and note(CHECKPOINT, "torch.save")
            try:
                return original(*args, **kwargs)
            finally:
                if noted:  # its return, by time: a checkpoint costs its own span
                    notes.append(Note(SAVED, "", "", "", clock()))
        return save

    def user_block(self_: Any) -> str | None:
        """The user's line that entered ``self_`` (a block turning gradients
        off), None for a library's; in O(1) frames but for a decorated
        function's (torch's frames up to its caller)."""
        f = sys._getframe(2)
        code = f.f_code
        k = kind(code.co_filename)
        if k != USER:
            if code.co_filename != wrapper_file:
                return None  # a library's block (clip_grad_norm_, Module.to): no walk
            back = f.f_back
            while back is not None and kind(back.f_code.co_filename) == ENGINE:
                back = back.f_back
            if back is None or kind(back.f_code.co_filename) != USER:
                return None
            f, code = back, back.f_code
        key = (code, f.f_lineno)
        location = lines.get(key)
        if location is None:
            location = f"{code.co_filename}:{f.f_lineno}"
            if len(lines) < MAX_LINES:
                lines[key] = location
        return location

    def wrap_enter(original: Callable[..., Any], detail: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def __enter__(self_: Any) -> Any:
            if block[0] is None and not compiling() and grad_on():
                try:
                    location = (user_block(self_) if getattr(self_, "mode", True) is True
                                else None)
                    if location is not None and location not in quiet:
                        notes.append(Note(NOGRAD, location, "", detail, clock()))
                        block[0], block[1] = self_, location
                        gaps.noted()
                except Exception as e:  # noqa: BLE001 - a hook never raises into the program
                    ctx.failed("torch.gaps", e)
            return original(self_)
        return __enter__

    def wrap_exit(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __exit__(self_: Any, *exc: Any) -> Any:
            if block[0] is self_:  # the noted block's end, by time
                block[0] = None
                notes.append(Note(GRAD_ON, block[1], "", "", clock()))
            return original(self_, *exc)
        return __exit__

    patches.apply(torch.nn.Module, "eval", wrap_eval)
    patches.apply(torch.nn.Module, "train", wrap_train, params=("self", "mode"))
    patches.apply(torch, "save", wrap_save)
    for cls, detail in ((torch.no_grad, "torch.no_grad()"),
                        (torch.inference_mode, "torch.inference_mode()")):
        patches.apply(cls, "__enter__", functools.partial(wrap_enter, detail=detail))
        patches.apply(cls, "__exit__", wrap_exit)
