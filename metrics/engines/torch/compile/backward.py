"""The backward graphs AOTAutograd compiles lazily, at the first ``backward()``.

torch.compile hands Dynamo's graph to AOTAutograd, which compiles the forward
at once and the backward only when autograd first needs it, outside Dynamo's
compile: the forward's compile record (``CompilationMetrics``) does not hold
it. On a training step that backward compile is often the larger half (a
nanoGPT iteration 0 here: 16 s of forward, 37 s more at ``loss.backward()``).
Its own record (``is_forward=False``) carries its time and the compile id of
the Dynamo frame it belongs to; the time is added to that frame's graphs in
the ledger (a backend compile, observed in ``CompileTime``, not counted as a
Dynamo graph in ``UncachedCompile``).

Example:
    >>> from metrics.recording.recorder import Recorder
    >>> rec = Recorder()
    >>> rec.ledger.compiled("ab", "compile(Net.forward)", "torch_compile", 1.0)
    >>> b = BackwardCompiles(rec)
    >>> b.remember("0/0", "ab")
    >>> b.compiled("0/0", 2.5)
    >>> rec.ledger.snapshot()[0].compile_seconds_total
    3.5
"""

from __future__ import annotations

from collections import OrderedDict

from metrics.recording.recorder import Recorder
from tpu_info.contract import catalog as names

# Compile ids remembered (a backward compiles after its forward, usually at once).
_MAX_COMPILES = 256


class BackwardCompiles:
    """Graph hashes per Dynamo compile id, and the backward compiles' time
    added to them (each call runs inside the user's program: the caller
    guards it)."""

    def __init__(self, recorder: Recorder) -> None:
        self._rec = recorder
        self._compile_time = recorder.distribution(names.COMPILE_TIME)
        self._hashes: OrderedDict[str, list[str]] = OrderedDict()
        recorder.on_reset(self._hashes.clear)

    def remember(self, compile_id: str, graph_hash: str) -> None:
        """``graph_hash`` was compiled by the Dynamo compile ``compile_id``."""
        d = self._hashes
        d.setdefault(compile_id, []).append(graph_hash)
        d.move_to_end(compile_id)
        while len(d) > _MAX_COMPILES:
            d.popitem(last=False)

    def compiled(self, compile_id: str | None, seconds: float | None) -> None:
        """The backward of ``compile_id`` took ``seconds`` to compile."""
        if not seconds or seconds <= 0:
            return
        self._compile_time.observe(seconds * 1e9)
        hashes = self._hashes.get(str(compile_id)) if compile_id is not None else None
        for h in hashes or ():
            self._rec.ledger.compile_time_added(h, seconds / len(hashes or (1,)))
