"""Region and step annotations: ``Trace`` and ``StepTrace``, torch_xla's names.

When no capture is running an annotation costs one global check on entry
and one on exit; during a capture each entry and exit appends one tuple to
the capture's buffer (no lock: ``list.append`` is atomic under the GIL).
The buffer is bounded: when it fills, recording stops and the capture notes
the truncation.

Example:
    >>> import profiler
    >>> with profiler.Trace("load_batch"):
    ...     pass
    >>> @profiler.Trace("forward")
    ... def forward(x):
    ...     return x
    >>> for step in range(2):
    ...     with profiler.StepTrace("train_step", step_num=step):
    ...         _ = forward(step)
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import metrics
from tpu_info.outputs.chrome_trace import Record

__all__ = ["Trace", "StepTrace", "Record", "start_recording", "stop_recording", "recording"]

F = TypeVar("F", bound=Callable[..., Any])

_now = time.perf_counter_ns
_tid = threading.get_native_id

# The one flag the hot path reads: the running capture's buffer, or None.
_buf: list[Record] | None = None
_cap = 0
_full_at_ns: int | None = None
_owned: list[Record] | None = None  # the same buffer, kept after the hot path lets go
_state_lock = threading.Lock()


def _record(phase: str, name: str, args: dict[str, Any] | None) -> None:
    global _buf, _full_at_ns
    buf = _buf
    if buf is None:  # the capture ended between the caller's check and here
        return
    buf.append((phase, _now(), _tid(), name, args))
    if len(buf) >= _cap:
        # Full: stop recording; the capture closes spans left open at this time.
        _full_at_ns = _now()
        _buf = None


class Trace:
    """Marks a region of code as a span on the calling thread's track.

    Use as a context manager or as a decorator; one instance may be used
    by many threads and re-entered (it keeps no per-use state).

    Args:
        name: the span's name in the trace.
        **kwargs: extra values shown with the span (its ``args``).
    """

    __slots__ = ("name", "args")

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = name
        self.args = kwargs or None

    def __enter__(self) -> Trace:
        if _buf is not None:
            _record("B", self.name, self.args)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if _buf is not None:
            _record("E", self.name, None)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return traced  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class StepTrace(Trace):
    """A training step: a span like :class:`Trace`, and on exit one
    ``metrics.mark_step()`` (counter ``MarkStep``, distribution ``StepTime``,
    and a step on the capture's step track).

    Args:
        name: the span's name, for example ``"train_step"``.
        step_num: the step's number, shown with the span.
        **kwargs: extra values shown with the span.
    """

    __slots__ = ()

    def __init__(self, name: str, step_num: int | None = None, **kwargs: Any) -> None:
        if step_num is not None:
            kwargs["step_num"] = step_num
        super().__init__(name, **kwargs)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if _buf is not None:
            _record("E", self.name, None)
        metrics.recorder().mark_step()


def start_recording(max_records: int) -> None:
    """Starts buffering annotations (the capture calls this).

    Raises:
        RuntimeError: a recording is already running.
    """
    global _buf, _cap, _full_at_ns, _owned
    with _state_lock:
        if _owned is not None:
            raise RuntimeError("annotations are already being recorded")
        _cap = max(1, int(max_records))
        _full_at_ns = None
        _owned = []
        _buf = _owned


def stop_recording() -> tuple[list[Record], int | None]:
    """Stops buffering; returns the records and, if the buffer filled, the
    ``perf_counter_ns`` time it filled at."""
    global _buf, _owned
    with _state_lock:
        buf = _owned if _owned is not None else []
        _buf = _owned = None
        return buf, _full_at_ns


def recording() -> bool:
    """Whether annotations are being recorded right now."""
    return _buf is not None
