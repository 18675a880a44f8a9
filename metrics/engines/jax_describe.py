r"""How the JAX hook describes a compile: the cause JAX's
``jax_explain_cache_misses`` gives (captured from its logger, parsed) and the
input signature from the lowering step.

Example:
    >>> fn, cause = parse_cache_miss(
    ...     "TRACING CACHE MISS at t.py:9 (f):\n  for f defined at t.py:3\n"
    ...     "  * at x, now f32[4] and before f32[3]", 0.0)
    >>> fn, cause.description, cause.location
    ('f', "argument 'x' changed f32[3] -> f32[4]", 't.py:9')
"""

from __future__ import annotations

import logging
import re
from typing import Any, Protocol

from tpu_info.model import FIRST_CALL, RecompileCause

# Where JAX logs its explanations (0.10: partial_eval; older: pjit).
EXPLAIN_LOGGERS = ("jax._src.interpreters.partial_eval", "jax._src.pjit")
_MISS_RE = re.compile(r"TRACING CACHE MISS at (?P<loc>.+?:\d+)")
_FUNC_RE = re.compile(r"(?:for|^\s*)\s*(?P<name>\S+?)(?: id=\d+)? defined at", re.M)
_ARG_RE = re.compile(r"\* at (?P<arg>.+?), now (?P<new>\S+) and before (?P<old>\S+)")
_NOISE = ("all previously seen cache keys differ", "For the closest previous key")


class _Listener(Protocol):
    def on_cache_miss(self, message: str) -> None: ...


def parse_cache_miss(message: str, now: float) -> tuple[str | None, RecompileCause]:
    """Turns one ``jax_explain_cache_misses`` record into (function, cause)."""
    loc = _MISS_RE.search(message)
    func = _FUNC_RE.search(message)
    changed = list(_ARG_RE.finditer(message))
    arg = changed[0] if changed else None
    body = [
        ln.strip().lstrip("* ").rstrip(":")
        for ln in message.splitlines()[1:]
        if ln.strip() and not any(n in ln for n in _NOISE)
    ]
    body = [b for b in body if " defined at " not in b]
    if "never seen function" in message:
        description = FIRST_CALL
    elif arg:
        description = (f"argument '{arg.group('arg')}' changed "
                       f"{arg.group('old')} -> {arg.group('new')}")
        if len(changed) > 1:
            others = ", ".join(f"'{m.group('arg')}'" for m in changed[1:4])
            description += f" (also {others}{', ...' if len(changed) > 4 else ''})"
    else:
        description = "; ".join(body) or message.strip()
    cause = RecompileCause(
        time_unix=now,
        description=description,
        location=loc.group("loc") if loc else None,
        argument=arg.group("arg") if arg else None,
        before=arg.group("old") if arg else None,
        after=arg.group("new") if arg else None,
    )
    return (func.group("name") if func else None), cause


class ExplainFilter(logging.Filter):
    """Captures explain-cache-miss records; drops them unless the user asked."""

    def __init__(self, engine: _Listener, passthrough: bool) -> None:
        super().__init__()
        self.engine = engine
        self.passthrough = passthrough

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            return True
        if not msg.startswith("TRACING CACHE MISS"):
            return True
        self.engine.on_cache_miss(msg)
        return self.passthrough


def format_aval(name: str | None, aval: Any, sharding: Any) -> str:
    try:
        s = aval.str_short(short_dtypes=True)
    except Exception:  # noqa: BLE001
        s = str(aval)
    if getattr(aval, "weak_type", False):
        s += "{weak}"
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        s += f" sharded{tuple(spec)}"
    return f"{name}: {s}" if name else s
