"""Recompile causes in clean words: what kind of change it was and the advice for it.

The engines record causes in their own words (the JAX hook as ``argument 'x'
changed OLD -> NEW``, ``static argument 'mode' changed 2 -> 3``, ``argument 'x'
moved device 0 -> device 1``, ``jax_enable_x64 changed False -> True``;
Dynamo's guard failures; torch_xla's analysis). :func:`clean_text` strips what
only JAX's log needs (doc URLs, ``{weak_type=...}``); :func:`classify` names
the kind of change and the advice that fits it, and only that advice.

Example:
    >>> from tpu_info.model import RecompileCause
    >>> c = RecompileCause(0.0, "argument 'x' changed f32[3] -> i32[3]", None, "x",
    ...                    "f32[3]", "i32[3]")
    >>> k = classify(c)
    >>> k.kind, k.text
    ('dtype', "argument 'x' changed f32[3] -> i32[3] (dtype)")
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpu_info.model import FIRST_CALL, RecompileCause

_URL_RE = re.compile(r"\s*https?://\S+")
_WEAK_TRUE_RE = re.compile(r"\s*\{weak(?:_type=True)?\}")
_WEAK_FALSE_RE = re.compile(r"\{weak_type=False\}")
_SHAPE_RE = re.compile(r"^(?P<dtype>[a-z]+\d*)\[(?P<dims>[^\]]*)\]")
_AXIS_RE = re.compile(r"@[\w,]+")  # f32[8@d]: dimension 0 sharded over mesh axis d
_TORCH_SIZE_RE = re.compile(r"size mismatch at index (?P<i>\d+)")
_ALSO_RE = re.compile(r" \(also (?P<others>[^()]*)\)$")
# The JAX hook's forms (metrics/engines/jax_causes.py).
_STATIC_ARG_RE = re.compile(r"^static argument \S.* changed ")
_MOVED_RE = re.compile(r"^argument \S.* moved ")
_ARG_RE = re.compile(r"^argument \S.* changed ")
_OPTION_RE = re.compile(r"^(?P<name>\w+) changed ")
_NODE_RE = re.compile(r"^\w+(?:\(.*\)| of \d+)?$")  # dict('a', 'b'), list of 3, tuple, leaf


@dataclass(frozen=True, slots=True)
class CauseKind:
    """One cause, classified: ``kind`` is a short name, ``text`` the clean words
    with the kind named, ``words`` the clean words alone, ``advice`` what to do,
    ``expected`` when it is normal."""

    kind: str
    text: str
    words: str
    advice: str
    expected: bool = False


def clean_type(t: str | None) -> str:
    """``f32[]{weak_type=True}https://...`` (or ``f32[]{weak}``) -> ``f32[] (weak)``;
    ``{weak_type=False}``: dropped."""
    t = _URL_RE.sub("", t or "")
    return _WEAK_FALSE_RE.sub("", _WEAK_TRUE_RE.sub(" (weak)", t)).strip()


def clean_text(text: str) -> str:
    """A cause description without JAX's doc URLs and raw ``weak_type`` notation."""
    return clean_type(text)


def _dims(t: str) -> tuple[str, list[str]] | None:
    m = _SHAPE_RE.match(t)
    if not m:
        return None
    dims = m.group("dims")
    return m.group("dtype"), (dims.split(",") if dims else [])


def _shape_kind(before: str, after: str, second_site: bool) -> tuple[str, str, bool] | None:
    b, a = _dims(before), _dims(after)
    if not (b and a):
        return None
    if b[0] != a[0]:
        return ("dtype", "Cast the input to one dtype at the boundary, before the call "
                "(x.astype(dtype)), so every call sees the same dtype.", False)
    bd, ad = [_AXIS_RE.sub("", d) for d in b[1]], [_AXIS_RE.sub("", d) for d in a[1]]
    if bd == ad:
        if before.endswith("(weak)") != after.endswith("(weak)"):
            return ("weak type",
                    "A Python scalar and a typed value alternate: pass a typed value every "
                    "time (jnp.float32(x)), or make the argument static.", False)
        if before != after:
            return _SHARDING
        return None  # same type: something else changed
    if len(bd) == len(ad) and bd[1:] == ad[1:] and bd[0] != ad[0]:
        return _batch_kind(bd[0], ad[0], second_site)
    if len(bd) == len(ad) and bd[0] == ad[0]:
        return ("shape change in a non-batch dimension",
                "Bucket that dimension to a few fixed sizes (pad to the next bucket).", False)
    return ("shape change (rank)", "Keep the argument's rank fixed; bucket its sizes.", False)


def _batch_kind(old: str, new: str, second_site: bool) -> tuple[str, str, bool]:
    if second_site:
        return ("second batch size, e.g. evaluation vs training",
                "Expected once per size: each size compiles once and is cached after. "
                "Keep the number of distinct sizes small (one for training, one for "
                "evaluation), or pad evaluation batches to the training size.", True)
    try:
        shorter = int(new) < int(old)
    except ValueError:
        shorter = False
    if not shorter:
        return ("batch size varies",
                "Pad or bucket batches to a few fixed sizes, or call evaluation at a "
                "larger size from its own function (each size compiles once).", False)
    return ("short last batch",
            "Pad or bucket the last batch (or drop it: drop_last=True).", False)


_SHARDING = ("sharding", "device_put the inputs with one fixed sharding before the loop, and "
             "return outputs with the sharding the next call expects.", False)


def classify(cause: RecompileCause, first_site: str | None = None) -> CauseKind:
    """The kind of ``cause`` with its clean text and advice. ``first_site`` is the
    call site of the function's first compile: a change seen at another site is a
    second caller (evaluation), not a short last batch.

    ``text`` names the kind after the change and before the other arguments that
    changed with it: ``argument 'x' changed f32[2] -> f32[3] (batch size varies;
    also 'y')``."""
    text = clean_text(cause.description)
    before, after = clean_type(cause.before), clean_type(cause.after)
    second_site = bool(first_site and cause.location and first_site != cause.location)
    kind = _kind(cause, text, before, after, second_site)
    also = _ALSO_RE.search(text)
    head = text[:also.start()] if also else text
    more = f"; also {also.group('others')}" if also else ""
    return CauseKind(kind[0], f"{head} ({kind[0]}{more})", text, kind[1], kind[2])


def _kind(cause: RecompileCause, text: str, before: str, after: str,
          second_site: bool) -> tuple[str, str, bool]:
    d = cause.description
    if d == FIRST_CALL:
        return ("first call", "Nothing to do: every function compiles on its first call.", True)
    if _STATIC_ARG_RE.match(text):
        return _static()
    if _MOVED_RE.match(text):
        return ("sharding/device",
                "The array moved between devices (or between committed and uncommitted) "
                "since the last call: keep it on one device, device_put it once before the "
                "loop rather than on each call.", False)
    if before and after and (k := _shape_kind(before, after, second_site)):
        return k
    if _ARG_RE.match(text) and _NODE_RE.match(before) and _NODE_RE.match(after):
        return _PYTREE  # not array types: the containers around them
    if (m := _OPTION_RE.match(text)) and m.group("name").startswith("jax_"):
        return ("config",
                f"The option {m.group('name')} differs between calls and each value compiles "
                "again: set it once before the loop (jax.config.update at start-up), not "
                "around some calls.", False)
    if m := _TORCH_SIZE_RE.search(d):
        if m.group("i") == "0":
            return _batch_kind(before or "0", after or "0", second_site) if before and after \
                else _batch_kind("1", "1", second_site)
        return ("shape change in a non-batch dimension",
                "Bucket that dimension to a few fixed sizes, or mark it dynamic "
                "(torch._dynamo.mark_dynamic(x, dim)).", False)
    if "grad_mode" in d:
        return ("global state: grad_mode",
                "Expected when evaluation runs under torch.no_grad(): it compiles its own "
                "graph once. Compile the eval step as its own function (or run it under "
                "no_grad every time) so training and evaluation do not retrace each other.",
                True)
    if "GLOBAL_STATE" in d or "global state" in d.lower():
        return ("global state",
                "Keep torch's global state (grad mode, autocast, deterministic "
                "algorithms, default dtype) the same on every call.", False)
    if "Static(val=" in d:  # JAX's raw text, from a hook before these forms
        return _static()
    if "pytree" in d:
        return _PYTREE
    if "sharding" in d.lower() or (" sharded" in before + after):
        return _SHARDING
    if "mesh" in d:
        return ("config/context: mesh",
                "The mesh in context differs between calls: enter the mesh once around the "
                "whole loop (with jax.set_mesh(mesh)), not around some calls.", False)
    if "context" in d.lower() or "config" in d.lower():
        return ("config/context",
                "A context manager or config value differs between calls and each one "
                "compiles again: enter it (or set it) once around the whole loop, not "
                "around some calls.", False)
    if "___check_obj_id" in d or "ID_MATCH" in d or " id " in d:
        return ("object identity",
                "Dynamo guards on an object's identity: pass the same module/function "
                "object each call, or make the value a tensor argument.", False)
    return ("other", "Keep input shapes, dtypes and static arguments fixed across steps.",
            False)


def _static() -> tuple[str, str, bool]:
    return ("static argument",
            "Each new value of a static argument compiles again: pass it as an array "
            "(a traced argument), or keep its values few.", False)


_PYTREE = ("pytree structure",
           "Keep the structure fixed: pass the same containers on every call (same dict "
           "keys, list lengths, None vs array in the same places).", False)


def warm_up(graphs_compiles: int, engine: str) -> bool:
    """torch_xla compiles the first steps anew (step 0 has no optimizer state yet):
    a couple of graphs at one site is warm-up, not a recompile problem."""
    return engine == "torch_xla" and graphs_compiles <= 3
