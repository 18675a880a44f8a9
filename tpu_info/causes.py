"""Recompile causes in clean words: what kind of change it was and the advice for it.

The engines record causes in their own words (JAX's ``jax_explain_cache_misses``
text, Dynamo's guard failures, torch_xla's analysis). :func:`clean_text` strips
what only JAX's log needs (doc URLs, ``{weak_type=...}``); :func:`classify`
names the kind of change and the advice that fits it.

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
_WEAK_TRUE_RE = re.compile(r"\{weak_type=True\}")
_WEAK_FALSE_RE = re.compile(r"\{weak_type=False\}")
_SHAPE_RE = re.compile(r"^(?P<dtype>[a-z]+\d*)\[(?P<dims>[^\]]*)\]")
_STATIC_RE = re.compile(r"at (?P<where>.+?), now .*?Static\(val=(?P<new>.*?)\) "
                        r"and before .*?Static\(val=(?P<old>.*?)\)")
_TORCH_SIZE_RE = re.compile(r"size mismatch at index (?P<i>\d+)")
_MESH_RE = re.compile(r"(?P<what>\w+) differs: now (?P<new>.*) and before (?P<old>.*)$")


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
    """``f32[]{weak_type=True}https://...`` -> ``f32[]{weak}``; ``{weak_type=False}``: dropped."""
    t = _URL_RE.sub("", t or "")
    return _WEAK_FALSE_RE.sub("", _WEAK_TRUE_RE.sub("{weak}", t)).strip()


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
        return ("dtype", "Cast the input to one dtype before the call (x.astype(dtype)).", False)
    if before.endswith("{weak}") != after.endswith("{weak}"):
        return ("weak type: a Python scalar and an array alternate",
                "Pass jnp.asarray(x, dtype) every time (or always a Python scalar), "
                "so the argument keeps one fixed dtype.", False)
    bd, ad = b[1], a[1]
    if bd == ad:
        return None  # same shape: the sharding or something else changed
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


def classify(cause: RecompileCause, first_site: str | None = None) -> CauseKind:
    """The kind of ``cause`` with its clean text and advice. ``first_site`` is the
    call site of the function's first compile: a change seen at another site is a
    second caller (evaluation), not a short last batch."""
    text = clean_text(cause.description)
    before, after = clean_type(cause.before), clean_type(cause.after)
    if (m := _STATIC_RE.search(text)) is not None:
        text = f"static argument at {m.group('where')} changed {m.group('old')} -> {m.group('new')}"
    elif (m := _MESH_RE.search(text.split("; ")[-1])) is not None:
        text = f"{m.group('what')} changed {m.group('old')} -> {m.group('new')}"
    second_site = bool(first_site and cause.location and first_site != cause.location)
    kind = _kind(cause, text, before, after, second_site)
    return CauseKind(kind[0], f"{text} ({kind[0]})", text, kind[1], kind[2])


def _kind(cause: RecompileCause, text: str, before: str, after: str,
          second_site: bool) -> tuple[str, str, bool]:
    d = cause.description
    if d == FIRST_CALL:
        return ("first call", "Nothing to do: every function compiles on its first call.", True)
    if before and after and (k := _shape_kind(before, after, second_site)):
        return k
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
    if "Static(val=" in d or "static argument" in d.lower():
        return ("static argument value",
                "A static argument changed value: each value compiles its own graph. Make it "
                "a traced argument, or keep it to a few values.", False)
    if "pytree" in d:
        return ("pytree structure",
                "Pass the same structure on every call (same dict keys, list lengths, "
                "None vs array in the same places).", False)
    if "sharding" in d.lower() or (" sharded" in before + after):
        return ("sharding",
                "device_put the inputs with one fixed sharding before the loop, and return "
                "outputs with the sharding the next call expects.", False)
    if "mesh" in d or "context" in d.lower() or "config" in d.lower():
        return ("config/context: mesh" if "mesh" in d else "config/context",
                "A jax.config value or context manager (a mesh) differs between calls: enter "
                "the mesh once around the whole loop (with jax.set_mesh(mesh)), not around "
                "some calls; set config flags once at start-up.", False)
    if "___check_obj_id" in d or "ID_MATCH" in d or " id " in d:
        return ("object identity",
                "Dynamo guards on an object's identity: pass the same module/function "
                "object each call, or make the value a tensor argument.", False)
    return ("other", "Keep input shapes, dtypes and static arguments fixed across steps.",
            False)


def warm_up(graphs_compiles: int, engine: str) -> bool:
    """torch_xla compiles the first steps anew (step 0 has no optimizer state yet):
    a couple of graphs at one site is warm-up, not a recompile problem."""
    return engine == "torch_xla" and graphs_compiles <= 3
