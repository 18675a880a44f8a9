"""Reads of tensor values on the host (``loss.item()``, ``.tolist()``,
``.cpu()``), counted per user line for the torch.compile and torch._lazy
hooks: on a GPU or a lazy device each one waits for everything queued
before it, which neither Dynamo nor the lazy-tensor core records.

What counts as a read, decided where it is recorded:

* ``.item()`` / ``.tolist()`` / ``.cpu()`` of a tensor on a device (CUDA,
  lazy): always; ``.cpu()`` of a CPU tensor is not a read (it returns the
  tensor itself).
* Of a CPU tensor at the user's own line: kept, and reported only when the
  process uses no accelerator (no device read seen, CUDA not initialised):
  a CPU run (the tests, a laptop) shows the reads it would make on an
  accelerator, with their real (small) time. A CPU tensor read inside a
  library (the optimizer's step counters) is a host scalar, never a sync:
  not kept.
* torch_xla tensors are torch_xla's hook's (its own counters), not kept.

Cost: the three methods of ``torch.Tensor`` become Python functions whose
usual call is a countdown and the original call (``bench/torch_syncs.py``
measures it against a bare pass-through wrapper). The first
:data:`EXACT_READS` reads called from the user's code are each recorded,
and as many called from libraries' (an optimizer's ``step_t.item()``,
15 a step in AdamW's single-tensor path) on a budget of their own, decided
by the caller's code object (cached), so library reads never make the
user's lines sampled; after that one read in
:data:`MEAN_GAP` on average, at random (geometric gaps, so no loop's
rhythm can hide a line), each standing for :data:`MEAN_GAP` reads: counts
and times per line are then estimates, and ``blind_spots`` says so. A
recorded read is timed (on a device its time is the wait) and walked out
to the user's line (:meth:`~metrics.engines._frames.LibraryFrames.user_line`).
``float(t)``, ``int(t)`` and ``bool(t)`` are not hooked (type slots every
tensor comparison in the libraries runs through): named as a blind spot.

Example (what a read reads as)::

    SiteReading(kind="sync", location="/w/train.py:88", count=120, bytes=480,
                seconds=0.002, function="train", detail="item()")
"""

from __future__ import annotations

import math
import random
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch

from metrics.engines._frames import USER, frames_for, skip_prefixes
from metrics.engines.torch.context import TorchContext
from metrics.recording.journal import FOLD_AT
from metrics.recording.recorder import Recorder
from tpu_info.contract.model import SiteKind, SiteReading

EXACT_READS = 1000  # the first reads, each recorded
MEAN_GAP = 64  # then one read in this many (on average) is recorded, for this many
MAX_SITES = 256  # lines kept per class; the rest in one overflow entry
OTHER_SITES = "(other sites)"
NO_USER_FRAME = "(no user frame)"
FIELDS = 10  # (class, location, function, detail, via, start, end, weight, bytes, step) a record
DEVICE, CPU = 0, 1  # a record's class: a device tensor's read, a CPU tensor's at a user line
_HOOKED = {"item": "item()", "tolist": "tolist()", "cpu": "cpu()"}
# Library functions that name how the user's line read the value (outermost wins).
_VIA = {"__repr__": "print()", "__str__": "print()", "__format__": "format()/f-string",
        "__array__": "np.asarray()", "numpy": "numpy()"}
# torch's own printing of a value (print(t), f"{t}"): a read on the user's behalf.
_PRINTING = ("_tensor_str.py", "_tensor.py")
_GAP_RATE = -math.log(1.0 - 1.0 / MEAN_GAP)  # exponential rate whose floor + 1 is geometric

# The process's one hook: torch.Tensor's methods are process-wide, and so are
# the wrappers' countdown (a module global: the fast path reads nothing else)
# and the hook they report to (looked up at each recorded read).
_left = 1 << 62  # reads until the next recorded one
_hook: SyncReads | None = None  # the one installed, shared by the torch engines


class SyncReads:
    """The host reads of one process: the ``torch.Tensor`` patches, their
    journal and the per-line table; reported by the first engine that
    attached (a process with torch.compile and torch._lazy has both)."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.owners: list[TorchContext] = []
        self.missing: list[str] = []
        self.exact_left = EXACT_READS  # the user's reads
        self.library_left = EXACT_READS  # the libraries' own reads
        self.sampled = self.library_sampled = False
        self._library_gap = 1
        self._callers: dict[CodeType, bool] = {}  # a read's caller: the user's code?
        self._rng = random.Random()
        self._frames = frames_for(skip_prefixes(torch))  # the user's frames from libraries'
        self._lock = threading.Lock()
        # (class, location, detail) -> [count, ns, bytes, first end, last end,
        # function, via, last step, occurrences]
        self._sites: dict[tuple[int, str, str], list[Any]] = {}
        self._kept = {DEVICE: 0, CPU: 0}
        self._originals: dict[str, tuple[Callable[..., Any], bool]] = {}
        self.journal = recorder.journal(self._fold)
        self.queue = self.journal.queue
        # Which step a read belongs to (steps marked, optimizer steps): the
        # first owner's, set by attach(); a burst of reads in one step (an
        # evaluation's per-batch .item()) is one occurrence of its line.
        self.step_index: Callable[[], int] = recorder.steps_so_far

    # Install ---------------------------------------------------------------

    def patch(self) -> None:
        global _left
        for name, detail in _HOOKED.items():
            original = getattr(torch.Tensor, name, None)
            if original is None:
                self.missing.append(f"tensor.{detail} reads are not counted: "
                                    f"torch.Tensor.{name} is missing")
                continue
            self._originals[name] = (original, name in vars(torch.Tensor))
            setattr(torch.Tensor, name, _reader(name, original, detail))
        _left = 1

    def unpatch(self) -> None:
        global _left
        _left = 1 << 62
        for name, (original, own) in self._originals.items():
            if own:
                setattr(torch.Tensor, name, original)
            elif name in vars(torch.Tensor):
                delattr(torch.Tensor, name)  # the base class's method shows again
        self._originals.clear()

    # Hot path (a recorded read only) ---------------------------------------

    def is_user_read(self, code: CodeType) -> bool:
        """A read called from the user's code (or torch's printing of a
        value, on the user's behalf), not from a library's (an optimizer's
        ``step_t.item()``): decided once per code object."""
        user = self._callers.get(code)
        if user is None:
            name = code.co_filename
            user = self._frames.kind(name) == USER or name.endswith(_PRINTING)
            if len(self._callers) < 1 << 14:
                self._callers[code] = user
        return user

    def next_weight(self, user: bool) -> int:
        """How many reads this one stands for (0: not recorded), and the
        countdown to the next recorded read. The user's reads and the
        libraries' have a budget each of :data:`EXACT_READS` exact reads,
        so an optimizer's 15 reads a step never make the user's lines
        sampled; while the user's budget lasts every read comes here, and a
        library's read past its own budget is sampled by its own countdown."""
        global _left
        if user:
            if self.exact_left > 0:
                self.exact_left -= 1
                weight = 1
            else:
                self.sampled = True
                weight = MEAN_GAP
        elif self.library_left > 0:
            self.library_left -= 1
            weight = 1
        elif self.exact_left > 0:  # here for the user's sake: the library's own countdown
            self.library_sampled = True
            self._library_gap -= 1
            if self._library_gap > 0:
                weight = 0
            else:
                self._library_gap = self._gap()
                weight = MEAN_GAP
        else:
            self.library_sampled = True
            weight = MEAN_GAP
        _left = 1 if self.exact_left > 0 else self._gap()
        return weight

    def _gap(self) -> int:
        return 1 + int(self._rng.expovariate(_GAP_RATE))

    def record(self, tensor: torch.Tensor, detail: str, start: int, end: int,
               weight: int) -> None:
        """One read of ``tensor`` (``detail``: how), timed ``start``..``end``
        (monotonic ns), standing for ``weight`` reads: kept when it is one
        (see the module docstring), at the user's line."""
        if tensor.is_cpu:
            if detail == "cpu()":
                return  # the tensor itself: nothing moves
            cls = CPU
        elif getattr(tensor, "is_xla", False) or tensor.is_meta:
            return
        else:
            cls = DEVICE
        if torch._guards.TracingContext.try_get() is not None:
            return  # Dynamo or AOT tracing reading a real value: not the program's
        kind = self._frames.kind
        f: FrameType | None = sys._getframe(3)  # record <- _read <- the wrapper <- its caller
        code = f.f_code if f is not None else None
        if f is not None and code is not None and kind(code.co_filename) == USER:  # usual
            location, via = f"{code.co_filename}:{f.f_lineno}", ""
        else:
            named = None  # torch's function that says how the line read it (print())
            while f is not None and kind(f.f_code.co_filename) != USER:
                named = _VIA.get(f.f_code.co_name, named)
                f = f.f_back
            if cls == CPU and named is None:
                return  # a library's host scalar (an optimizer's step count)
            if named is not None:
                detail = f"{named} ({detail})"
            line = self._frames.user_line(4)
            location, via = (line.location, line.via) if line is not None else (NO_USER_FRAME, "")
            code = f.f_code if f is not None else None
        function = getattr(code, "co_qualname", code.co_name) if code is not None else ""
        q = self.queue
        q.extend((cls, location, function, detail, via, start, end, weight,
                  tensor.numel() * tensor.element_size(), self.step_index()))
        if len(q) >= FOLD_AT * FIELDS:
            self.journal.flush()

    # Fold and read -----------------------------------------------------------

    def _fold(self, flat: list[Any]) -> None:
        w = FIELDS
        with self._lock:
            for i in range(0, len(flat), w):
                (cls, location, function, detail, via, start, end, weight, nbytes,
                 step) = flat[i:i + w]
                key = (cls, location, detail)
                site = self._sites.get(key)
                if site is None:
                    if self._kept[cls] >= MAX_SITES:
                        key = (cls, OTHER_SITES, "more lines than kept")
                        site = self._sites.get(key)
                    if site is None:
                        self._kept[cls] += 1
                        site = self._sites[key] = [0, 0, 0, end, end, function, via, -1, 0,
                                                   False]
                if step != site[7]:  # the first read of this line in this step
                    site[7] = step
                    site[8] += weight  # sampled: an estimate, as the count is
                site[0] += weight
                site[9] = site[9] or weight > 1  # (an estimate from here on)
                site[1] += (end - start) * weight
                site[2] += nbytes * weight
                site[3] = min(site[3], end)
                site[4] = max(site[4], end)

    def sites(self, owner: TorchContext) -> list[SiteReading]:
        """The reads per line, for the first engine that attached (none for
        the others); a CPU tensor's reads only in a process that uses no
        accelerator."""
        if not self.owners or owner is not self.owners[0]:
            return []
        self.journal.flush()
        with self._lock:
            rows = [(k, list(v)) for k, v in self._sites.items()]
        cls = DEVICE if any(k[0] == DEVICE for k, _ in rows) or _accelerated() else CPU
        to_unix = self.rec.mono_to_unix
        return [SiteReading(kind=SiteKind.SYNC.value, location=location, count=count,
                            bytes=nbytes, seconds=ns / 1e9, function=function, detail=detail,
                            last_seen_unix=last / 1e9 + to_unix,
                            first_seen_unix=first / 1e9 + to_unix, via=via,
                            occurrences=min(count, occurrences), estimated=estimated)
                for (c, location, detail), (count, ns, nbytes, first, last, function, via, _,
                                            occurrences, estimated) in rows
                if c == cls and count]

    def blind_spots(self, owner: TorchContext) -> list[str]:
        """What the sync hook does not count in this process, for the first
        engine that attached."""
        if not self.owners or owner is not self.owners[0]:
            return []
        out = list(self.missing)
        out.append("float(t), int(t) and bool(t) (if t > 0:) of a tensor read its value on "
                   "the host without being counted (only .item(), .tolist() and .cpu() are)")
        if self.sampled:
            out.append(f"after the first {EXACT_READS:,} tensor reads at your lines one in "
                       f"{MEAN_GAP} is recorded (at random): the counts and times of .item()/"
                       ".tolist()/.cpu() per line are estimates")
        elif self.library_sampled:
            out.append(f"after the first {EXACT_READS:,} tensor reads inside libraries one in "
                       f"{MEAN_GAP} is recorded (at random): the counts of reads that "
                       "libraries make for your lines are estimates (your own lines' reads "
                       "are exact)")
        return out

    def clear(self) -> None:
        """Forgets every read (the recorder's reset): counting starts exact again."""
        global _left
        self.journal.clear()
        with self._lock:
            self._sites.clear()
            self._kept = {DEVICE: 0, CPU: 0}
            self.exact_left, self.sampled = EXACT_READS, False
            self.library_left, self.library_sampled = EXACT_READS, False
            if self._originals:
                _left = 1


def _accelerated() -> bool:
    """The process computes on an accelerator (CUDA in use, or torch_xla)."""
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized()) or "torch_xla" in sys.modules


def attach(owner: TorchContext) -> SyncReads:
    """The process's sync hook (patched on the first attach), with
    ``owner`` (an engine's context) among its owners."""
    global _hook
    if _hook is None:
        _hook = SyncReads(owner.rec)
        _hook.patch()
        owner.rec.on_reset(_hook.clear)
    if owner not in _hook.owners:
        _hook.owners.append(owner)
        if owner.optimizer is not None and len(_hook.owners) == 1:
            _hook.step_index = owner.steps_so_far
    return _hook


def detach(owner: TorchContext) -> None:
    """``owner`` is gone; the last owner's going unpatches ``torch.Tensor``."""
    global _hook
    hook = _hook
    if hook is None:
        return
    if owner in hook.owners:
        hook.owners.remove(owner)
    if not hook.owners:
        hook.unpatch()
        _hook = None


def hide_from_dynamo() -> str | None:
    """Dynamo's frame hook neither compiles the read wrappers nor anything
    they call (a read from a compiled function's eager part would otherwise
    be compiled as a frame of its own); the reason when it cannot be done.
    Needs ``torch._dynamo`` imported (the torch.compile hook calls it)."""
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError as e:
        return f"Dynamo's frame strategies are unavailable ({e})"
    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)  # this frame and below
    hook = _hook
    methods = list(vars(torch.Tensor).get(n) for n in _HOOKED) if hook is not None else []
    for fn in [*methods, _read]:
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename == __file__:
            set_code_exec_strategy(code, skip)
    return None


def _reader(name: str, original: Callable[..., Any], detail: str) -> Callable[..., Any]:
    if name == "cpu":
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            global _left
            _left -= 1
            if _left > 0:
                return original(self, *args, **kwargs)
            return _read(original, detail, self, args, kwargs)
    else:
        def read(self: torch.Tensor) -> Any:  # type: ignore[misc]
            global _left
            _left -= 1
            if _left > 0:
                return original(self)
            return _read(original, detail, self, (), {})

    read.__name__ = name
    read.__qualname__ = f"Tensor.{name}"
    read.__doc__ = original.__doc__
    read.__wrapped__ = original  # type: ignore[attr-defined]
    return read


def _read(original: Callable[..., Any], detail: str, tensor: torch.Tensor,
          args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A recorded read: timed, then walked out to the user's line."""
    global _left
    hook = _hook
    if hook is None:
        _left = 1 << 62
        return original(tensor, *args, **kwargs)
    try:
        weight = hook.next_weight(hook.is_user_read(sys._getframe(2).f_code))
    except Exception as e:  # noqa: BLE001 - a hook never raises into the program
        hook.rec.hook_failed("torch.sync", e)
        weight = 0
    if not weight:
        return original(tensor, *args, **kwargs)
    start = time.monotonic_ns()
    out = original(tensor, *args, **kwargs)
    end = time.monotonic_ns()
    try:
        hook.record(tensor, detail, start, end, weight)
    except Exception as e:  # noqa: BLE001 - a hook never raises into the program
        hook.rec.hook_failed("torch.sync", e)
    return out
