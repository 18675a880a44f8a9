"""What the parts of a torch adapter share: :class:`TorchContext`, made once
per engine and handed to its parts (the tensor-read hook, the optimizer's
steps, the compile records), instead of module state and back-references.

The torch.compile adapter extends it
(:class:`metrics.engines.torch.compile.context.CompileContext`); torch._lazy
uses it as it is.

Example:
    >>> from metrics.recording.recorder import Recorder
    >>> ctx = TorchContext("torch_lazy", Recorder(), skip=("/lib/",))
    >>> ctx.degraded, ctx.optimizer, ctx.syncs
    ([], None, None)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metrics.engines._patching import Patches
from metrics.recording.recorder import Recorder

if TYPE_CHECKING:
    from metrics.engines.torch.optim import OptimizerSteps
    from metrics.engines.torch.syncs import SyncReads

__all__ = ["TorchContext"]


class TorchContext:
    """One torch engine's recorder, notes and patches, and the shared parts it
    uses. Compared by identity: the tensor-read hook lists its owners."""

    def __init__(self, engine: str, recorder: Recorder, skip: tuple[str, ...] = ()) -> None:
        self.engine = engine  # the registry's name: the ledger's engine, HookErrors' prefix
        self.rec = recorder
        # What the hook could not set up (the engine's ``degraded``: the same list).
        self.degraded: list[str] = []
        self.patches = Patches(self.degraded)
        # Library directories: frames outside them are the user's.
        self.skip = skip
        # The optimizer's steps, where the engine counts them (torch.compile).
        self.optimizer: OptimizerSteps | None = None
        # Reads of tensor values (:mod:`metrics.engines.torch.syncs`), while installed.
        self.syncs: SyncReads | None = None

    def steps_so_far(self) -> int:
        """Steps so far (marked, and the optimizer's): which step a tensor
        read belongs to."""
        optimizer = self.optimizer
        marks = self.rec.steps_so_far()
        return marks if optimizer is None else optimizer.steps_so_far() + marks

    def failed(self, where: str, error: BaseException) -> None:
        """A hook failed inside the program: counted (``HookErrors``), never raised."""
        self.rec.hook_failed(where, error)
