"""Installs the tpu-info hook into an unmodified program (``tpu-info run``).

``tpu-info run`` puts this file's directory first on ``PYTHONPATH`` and sets
``TPU_INFO_AUTOINSTALL=1``. Python then imports this module at start-up
(``site`` imports ``sitecustomize``) and it:

1. runs the ``sitecustomize`` that would have been found without us (the
   next one on ``sys.path``), so a site's or a virtualenv's own still works;
2. when ``TPU_INFO_AUTOINSTALL=1``, adds a small import hook to
   ``sys.meta_path`` that waits for ``jax`` (or ``torch``) to finish
   importing and then calls ``metrics.install()``. Neither ``metrics`` nor
   any engine is imported before the program imports its engine, so a
   program that never imports one pays nothing and keeps its own module
   namespace.

It never breaks the program: any failure is reported once on stderr and the
program runs on unhooked. It is skipped, with a note, when the program has
its own top-level module called ``metrics`` (ours would shadow it).

Example (what ``tpu-info run -- python train.py`` does)::

    PYTHONPATH=.../metrics/_autoinstall TPU_INFO_AUTOINSTALL=1 python train.py
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import threading
from typing import Any

ENV_FLAG = "TPU_INFO_AUTOINSTALL"
# Top-level modules whose import means "the program uses this engine".
WATCHED = frozenset({"jax", "torch", "torch_xla"})  # install() again adds each engine

_HERE = os.path.dirname(os.path.abspath(__file__))
_METRICS_DIR = os.path.dirname(_HERE)
_PACKAGE_ROOT = os.path.dirname(_METRICS_DIR)
_reported = False
_lock = threading.Lock()


def _report(what: str, err: BaseException | None = None, unhooked: bool = True) -> None:
    global _reported
    if _reported:
        return
    _reported = True
    detail = f": {type(err).__name__}: {err}" if err is not None else ""
    tail = "; the program runs without the hook" if unhooked else ""
    try:
        sys.stderr.write(f"tpu-info: {what}{detail}{tail}\n")
    except Exception:  # noqa: BLE001 - no stderr: nothing more to do
        pass


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a or os.curdir, b)
    except OSError:
        return False


def _chain_next_sitecustomize() -> None:
    """Runs the ``sitecustomize`` that our directory shadows, if any."""
    path = [p for p in sys.path if not _same_dir(p, _HERE)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - what site.py itself does
        sys.stderr.write(f"Error in sitecustomize ({spec.origin}); set PYTHONVERBOSE "
                         f"for traceback:\n{type(e).__name__}: {e}\n")


def _install_hook() -> None:
    """Calls ``metrics.install()`` (ours, never a same-named module of the program)."""
    spec = importlib.util.find_spec("metrics")
    if spec is None:
        # A different interpreter than tpu-info's: let it find our package last.
        sys.path.append(_PACKAGE_ROOT)
        spec = importlib.util.find_spec("metrics")
    ours = os.path.join(_METRICS_DIR, "__init__.py")
    if spec is None or spec.origin is None or not _same_file(spec.origin, ours):
        where = spec.origin if spec is not None else "nowhere"
        _report(f"not installing: the module 'metrics' resolves to {where}, not {ours}")
        return
    import metrics

    metrics.install()


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class _EngineImportWatcher:
    """A meta-path finder that runs ``callback`` after each watched module executes.

    It finds nothing itself: it asks the finders after it for the spec and
    wraps that spec's ``loader.exec_module`` (the loader is a fresh object per
    spec, so the wrap touches nothing else).
    """

    def __init__(self, names: frozenset[str], callback: Any) -> None:
        self._names = set(names)
        self._callback = callback
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self._names or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
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

        def exec_module(module: Any) -> None:
            original(module)
            self._fire(fullname)

        try:
            loader.exec_module = exec_module
        except Exception:  # noqa: BLE001 - a loader we cannot wrap: import normally
            return spec
        return spec

    def _fire(self, fullname: str) -> None:
        with _lock:
            if fullname not in self._names:
                return  # already fired for it
            self._names.discard(fullname)
            if not self._names:
                try:
                    sys.meta_path.remove(self)
                except ValueError:
                    pass
        try:
            self._callback()
        except Exception as e:  # noqa: BLE001 - never break the program
            _report("could not install the metrics hook", e)


def _arm() -> None:
    pending = frozenset(n for n in WATCHED if n not in sys.modules)
    if pending:
        sys.meta_path.insert(0, _EngineImportWatcher(pending, _install_hook))
    if pending != WATCHED:  # an engine is already imported (by a .pth file, say)
        _install_hook()


try:
    _chain_next_sitecustomize()
except Exception as _e:  # noqa: BLE001
    _report("could not run the program's own sitecustomize", _e, unhooked=False)

if os.environ.get(ENV_FLAG) == "1":
    try:
        _arm()
    except Exception as _e:  # noqa: BLE001
        _report("could not arm the metrics hook", _e)
