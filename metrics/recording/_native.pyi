"""Types of the C hot path (``_native.c``); see :mod:`metrics.recording.native`."""

from collections.abc import Callable
from typing import Any

class Counting:
    untimed: int
    first: int
    every: int
    _owner: Any
    __wrapped__: Any
    def __init__(self, fn: Callable[..., Any], owner: Any, state: dict[str, Any],
                 timed: Callable[..., Any], report: Callable[..., Any],
                 keyed: Callable[..., Any], on_error: Callable[[BaseException], Any],
                 every: int, first: int, ndarray: type, fold_at: int) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class ShardPut:
    untimed: int
    first: int
    __wrapped__: Any
    def __init__(self, original: Callable[..., Any], state_fn: Callable[[], Any],
                 queue: list[Any], flush: Callable[[], Any], timed: Callable[..., Any],
                 other: Callable[[Any, int, int], Any], bytes_of: Callable[[Any], int],
                 on_error: Callable[[BaseException], Any], fold_at: int, first: int,
                 every: int) -> None: ...
    def __call__(self, xs: Any, shardings: Any, layouts: Any, copy_semantics: Any) -> Any: ...

class ExplicitScope:
    __wrapped__: Any
    def __init__(self, fn: Callable[..., Any]) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class SyncValue:
    __wrapped__: Any
    def __init__(self, fget: Callable[[Any], Any], codes: dict[int, Any], queue: list[Any],
                 flush: Callable[[], Any], record: Callable[..., Any], user: int, kind: int,
                 on_error: Callable[[BaseException], Any], fold_at: int,
                 ndarray: type | None = None) -> None: ...
    def __call__(self, array: Any) -> Any: ...

class StepMarker:
    def __init__(self, queue: list[Any], flush: Callable[[], Any], fold_at: int) -> None: ...
    def __call__(self) -> None: ...

def calling() -> Any | None: ...
