"""Runs a callback once a module has finished importing (the post-import hook).

One mechanism for both ways the hook reaches a program: ``metrics.install()``
called before the program imports its engine, and ``tpu-info run`` (whose
``sitecustomize`` loads this file before anything else). :func:`when_imported`
puts one meta-path finder first on ``sys.meta_path``. It finds nothing
itself: for a watched name it asks the finders after it for the spec and
wraps that spec's ``loader.exec_module``, so the callbacks run after the
module body finished without error. Once nothing is waiting the finder
removes itself.

* Cheap: a module already imported is never looked up again; any other
  first import costs one set lookup (about 250 ns).
* Thread-safe: one lock guards the waiting table; callbacks run outside it,
  in the importing thread, under that module's import lock (they may install
  hooks, but must never wait for another thread importing the same module).
* Never raises into the program: a callback's exception goes to ``on_error``
  (default: one line on stderr), a loader that cannot be wrapped imports
  normally.
* Fork-safe: a fork child starts with a free lock (another thread of the
  parent may have held it).

A finder ahead of ours that returns a module itself bypasses the hook:
:func:`ready` lets a caller check ``sys.modules`` later as a fallback.

This module imports only the standard library, and nothing of ``metrics``:
``tpu-info run`` loads it before the program runs.

Example:
    >>> from metrics.engines import importwatch
    >>> importwatch.when_imported("json", lambda: None)  # json: already imported, runs now
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

Callback = Callable[[], None]
_lock = threading.Lock()
_waiting: dict[str, list[Callback]] = {}  # module name -> callbacks not yet run
_finder: _PostImportFinder | None = None


def _default_error(name: str, err: BaseException) -> None:
    try:
        sys.stderr.write(f"tpu-info: a hook waiting for {name} failed: "
                         f"{type(err).__name__}: {err}\n")
    except Exception:  # noqa: BLE001, S110 - no stderr: nothing more to do
        pass


on_error: Callable[[str, BaseException], None] = _default_error
_late: set[str] = set()  # watched while already importing: checked at the next import
# Watched modules whose body ran: importlib still marks them initializing while
# their callbacks run (inside exec_module), yet they are whole.
_finished: set[str] = set()


def ready(name: str) -> bool:
    """Whether module ``name`` is imported and its body finished running."""
    module = sys.modules.get(name)
    if module is None:
        return False
    spec = getattr(module, "__spec__", None)
    return name in _finished or not getattr(spec, "_initializing", False)


def when_imported(name: str, callback: Callback) -> bool:
    """Runs ``callback()`` once module ``name`` finished importing.

    Now, in this thread, when it already has; else in the thread that imports
    it, right after its body ran. A module already importing (its loader ran
    before we watched it: ``torch`` finishing inside ``import torch_xla``)
    fires at the next import of any module after its body finished (its own
    submodules, usually), or at :func:`check`. Returns True when it ran now.
    """
    global _finder
    if ready(name):
        _run(name, [callback])
        return True
    with _lock:
        if name in sys.modules:
            _late.add(name)
        _waiting.setdefault(name, []).append(callback)
        if _finder is None:
            _finder = _PostImportFinder()
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    if ready(name):  # imported by another thread meanwhile, past our finder
        _fire(name)
    return False


def waiting() -> list[str]:
    """Module names that still have callbacks waiting, sorted."""
    with _lock:
        return sorted(_waiting)


def cancel(name: str) -> None:
    """Drops every callback waiting for ``name``."""
    with _lock:
        _waiting.pop(name, None)
        _late.discard(name)
        _remove_if_idle()


def check() -> None:
    """Fires the callbacks of modules imported past the finder (the fallback)."""
    for name in [n for n in waiting() if ready(n)]:
        _fire(name)


def _remove_if_idle() -> None:
    if not _waiting and _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass


def _fire_finished() -> None:
    """Fires the modules that were mid-import when watched and have finished."""
    for name in [n for n in list(_late) if ready(n)]:
        _fire(name)


def _fire(name: str) -> None:
    with _lock:
        _late.discard(name)
        callbacks = _waiting.pop(name, [])
        _remove_if_idle()
    _run(name, callbacks)


def _run(name: str, callbacks: list[Callback]) -> None:
    for cb in callbacks:
        try:
            cb()
        except Exception as e:  # noqa: BLE001 - never break the program's import
            try:
                on_error(name, e)
            except Exception:  # noqa: BLE001, S110
                pass


class _PostImportFinder:
    """A meta-path finder that wraps the loader of each watched module."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if getattr(self._busy, "on", False):
            return None
        if _late and fullname not in _waiting:
            _fire_finished()
        if fullname not in _waiting:
            return None
        self._busy.on = True  # our own look-up below must not come back here
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            # exec_module returned: the body ran; sys.modules holds it but
            # __spec__._initializing is still set, so fire directly.
            _finished.add(fullname)
            _fire(fullname)

        try:
            loader.exec_module = exec_module
        except Exception:  # noqa: BLE001 - a loader we cannot wrap: import normally
            pass
        return spec


def _free_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_free_lock_in_child)
