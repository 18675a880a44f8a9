"""The JAX hooks' usual calls in C, where that is built.

``metrics.recording._native`` (``_native.c``, compiled at install when a C
compiler is there) holds the callables: ``Counting``, a counted jitted
function; ``ShardPut``, the numpy shard handler that counts
``jax.device_put`` (and ``ExplicitScope``, what ``jax.device_put`` runs in,
so the handler knows its puts are explicit without asking JAX); and
``SyncValue``, the getter of ``jax.Array._value`` that counts device->host
reads (``float(loss)``, ``print(x)``). They run each hook's usual call (timed on the sampled
calls or not) without a Python frame and hand every other call (numpy
arguments, a compile, a function with several graphs) to the same Python
functions the pure-Python hooks run, so the records are the same either way.
:data:`metrics.config.PURE_PYTHON` switches it off (the Python hooks
then run every call); :func:`status` says which runs.

Example:
    >>> from metrics.recording import native
    >>> native.status().startswith(("C", "Python"))
    True
"""

from __future__ import annotations

from types import ModuleType

from metrics import config

# What the hooks take from the module (all of them, or the Python hooks).
CALLABLES = ("Counting", "ShardPut", "ExplicitScope", "SyncValue", "StepMarker")

_built: ModuleType | None
try:
    from metrics.recording import _native as _built
except ImportError as e:  # not compiled (no C compiler at install): the Python hooks
    _built = None
    # No module at all reads "cannot import name"; one that fails to load
    # (built for another Python) says why.
    _why = ("not built (no C compiler when this package was installed: reinstall with one, "
            "e.g. gcc, to get it)" if "cannot import name" in str(e) else f"not loadable ({e})")
else:
    _why = ""
    # A module compiled from an older _native.c (a checkout updated without
    # reinstalling) lacks the newer callables: the Python hooks then run,
    # all of them, rather than a mix decided hook by hook.
    _missing = [n for n in CALLABLES if not hasattr(_built, n)]
    if _missing:
        _built = None
        _why = (f"built from an older source (no {', '.join(_missing)}): reinstall "
                "(make venv, or pip install -e .) to rebuild it")

# What the hooks made from now on use: the module, or None for pure Python.
# Tests set it to compare the two.
NATIVE: ModuleType | None = None if config.flag(config.PURE_PYTHON) else _built


def native() -> ModuleType | None:
    """The C module the hooks use now, or None (pure Python)."""
    return NATIVE


def calling() -> object | None:
    """The owner of the counted call the C hot path runs on this thread now
    (a numpy shard handler under it has no wrapper frame to find), or None."""
    return _built.calling() if _built is not None else None


def array_layout(ndarray: type) -> type | None:
    """``ndarray`` when the C hot path reads numpy arrays' byte counts right
    (checked against numpy's own ``nbytes``: its head layout is NumPy's
    ABI, the same since 1.7), else None (then it looks ``nbytes`` up)."""
    if _built is None:
        return None
    import numpy as np

    class Sub(ndarray):  # type: ignore[misc,valid-type] - a subclass keeps the head
        __slots__ = ("extra",)

    samples = [np.zeros((3, 5), np.float32), np.zeros((), np.int8), np.zeros(0, np.complex128),
               np.zeros((2, 3, 4), np.float64)[:, ::2], np.zeros((7,), np.dtype("<U3")),
               np.zeros((4, 1), np.bool_), np.zeros(10, np.float16)]
    samples.append(np.zeros((6, 2), np.float32).view(Sub))
    try:
        ok = all(_built.array_nbytes(a, ndarray) == a.nbytes for a in samples
                 if isinstance(a, ndarray))
    except Exception:  # noqa: BLE001 - any doubt: the lookup
        ok = False
    return ndarray if ok else None


def built() -> ModuleType | None:
    """The C module, whether or not it is switched off."""
    return _built


def status() -> str:
    """One line: which hooks run the usual calls (the JAX engine's degraded notes
    carry it when they run in Python)."""
    if NATIVE is not None:
        return ("C (metrics.recording._native): the usual calls of jax.jit and device_put, "
                "and device->host reads")
    if _built is not None:
        return f"Python ({config.PURE_PYTHON.name}=1): every hooked call runs a Python frame"
    return f"Python: the C hot path is {_why}; every hooked call runs a Python frame"
