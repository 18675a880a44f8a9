"""Installs the tpu-info hook into an unmodified program (``tpu-info run``).

``tpu-info run`` puts this file's directory first on ``PYTHONPATH`` and sets
``TPU_INFO_AUTOINSTALL=1``. Python then imports this module at start-up
(``site`` imports ``sitecustomize``) and it:

1. runs the ``sitecustomize`` that would have been found without us (the
   next one on ``sys.path``), so a site's or a virtualenv's own still works;
2. when ``TPU_INFO_AUTOINSTALL=1``, loads :mod:`metrics.engines.importwatch` (the
   post-import hook ``metrics.install()`` uses for engines imported after
   it) and waits for any engine's trigger in :mod:`metrics.engines.registry`
   (``jax``, ``torch``, ``torch_xla``, ...) to finish importing, then calls
   ``metrics.install()`` and registers a capture that loads ``profiler`` at
   the first ``tpu-info profile`` (this file lives in ``profiler``, the one
   package that may use both: ``metrics`` never imports ``profiler``).
   Neither ``metrics`` nor any engine is imported before the program imports its engine, so a
   program that never imports one pays nothing and keeps its own module
   namespace.

It never breaks the program: any failure is reported once on stderr and the
program runs on unhooked. It is skipped, with a note, when the program has
its own top-level module called ``metrics`` (ours would shadow it).

Example (what ``tpu-info run -- python train.py`` does)::

    PYTHONPATH=.../profiler/_autoinstall TPU_INFO_AUTOINSTALL=1 python train.py
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

ENV_FLAG = "TPU_INFO_AUTOINSTALL"

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(_HERE))  # beside profiler: metrics
_METRICS_DIR = os.path.join(_PACKAGE_ROOT, "metrics")
_reported = False


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
    _offer_captures()


def _offer_captures() -> None:
    """Lets ``tpu-info profile`` trace the program, which never imported the
    profiler: this start-up code (not the ``metrics`` package, which never
    imports ``profiler``) wires the two together, and the profiler loads at
    the first capture allowed. A program's own ``import profiler`` replaces it."""
    from metrics.export import captures

    if captures.registered_capture() is None:
        captures.register_capture(_capture_with_profiler)


def _capture_with_profiler(duration_s: float, device: bool, stop: Any) -> Any:
    import profiler  # noqa: F401 - registers profiler.remote.capture in place of this
    from profiler import remote

    return remote.capture(duration_s, device, stop)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _load_standalone(name: str) -> Any:
    """A module of ``metrics`` that imports only the standard library
    (``metrics.engines.importwatch``, the post-import hook ``metrics.install()`` uses
    too; ``metrics.engines.registry``, the engines and their triggers), loaded
    from its file without importing the ``metrics`` package: the same module
    object serves both once the program's engine brings metrics in."""
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(_PACKAGE_ROOT, *name.split(".")) + ".py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _on_engine_import() -> None:
    try:
        _install_hook()
    except Exception as e:  # noqa: BLE001 - never break the program
        _report("could not install the metrics hook", e)


def _arm() -> None:
    """Calls ``metrics.install()`` when the first engine has been imported
    (now, if one already is: by a .pth file, say); ``install()`` itself then
    waits for the engines imported later, through the same watcher."""
    watch = _load_standalone("metrics.engines.importwatch")
    watch.on_error = lambda name, err: _report("could not install the metrics hook", err)
    for name in sorted(watched()):
        watch.when_imported(name, _on_engine_import)


def watched() -> frozenset[str]:
    """Modules whose import means "the program uses this engine": every
    engine's trigger in :mod:`metrics.engines.registry`. ``install()`` then
    waits for the others itself, through the same watcher and registry."""
    return frozenset(_load_standalone("metrics.engines.registry").triggers())


try:
    _chain_next_sitecustomize()
except Exception as _e:  # noqa: BLE001
    _report("could not run the program's own sitecustomize", _e, unhooked=False)

if os.environ.get(ENV_FLAG) == "1":
    try:
        _arm()
    except Exception as _e:  # noqa: BLE001
        _report("could not arm the metrics hook", _e)
