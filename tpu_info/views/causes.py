"""Recompile causes in clean words: the kind of change, named, and the advice for it.

The hooks type each cause (:class:`~tpu_info.contract.cause_kinds.CauseKind`
and the fields that say what changed: the dimension, the option, the guard,
the sync); :func:`classify` turns the kind into words and advice, and only the
advice that fits. The English is made here, once, at the output: the hooks'
own words (``argument 'x' changed f32[8] -> f32[5]``) are shown as they are,
the torch.compile guards and torch_xla's new graphs are told from their fields.

Advice fits how the program is written, from data it already carries: a
short last batch is told about ``drop_last=True`` only where torch (its
``DataLoader``) is loaded, read from the process's engines; a slicing loop
is told to skip or pad its short last slice; a change of batch size at
another call site than the function's first compile is a second caller
(evaluation); at a torch.compile guard a smaller batch is short at any site,
but a batch of one at another site is a second caller's (a generation). A
static argument whose values are functions compiles once per distinct
function, which is expected; a new object of the same function on each call
(a lambda or partial made in the loop) is not.

A cause from an older hook carries only its description (kind ``unknown``): the
kind is read back from its words by :func:`_typed_from_text`, the one place that parses prose.

Example:
    >>> from tpu_info.contract.cause_kinds import CauseKind
    >>> from tpu_info.contract.model import RecompileCause
    >>> c = RecompileCause(0.0, "argument 'x' changed f32[3] -> i32[3]", None, "x",
    ...                    "f32[3]", "i32[3]", kind=CauseKind.DTYPE)
    >>> k = classify(c)
    >>> k.kind, k.text
    ('dtype', "argument 'x' changed f32[3] -> i32[3] (dtype)")
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from tpu_info.contract.cause_kinds import (  # noqa: F401 - is_function re-exported
    CauseKind,
    is_function,
    shape_of,
    static_kind,
    type_change,
    xla_warm_up,
)
from tpu_info.contract.model import FIRST_CALL, RecompileCause
from tpu_info.views.causes_torch import GRAD_MODE, said_number, said_torch, torch_words

K = CauseKind
_KNOWN = frozenset(CauseKind) - {CauseKind.UNKNOWN}
_TORCH_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16",
                 "BFloat16": "bfloat16", "Long": "int64", "Int": "int32", "Short": "int16",
                 "Char": "int8", "Byte": "uint8", "Bool": "bool", "ComplexFloat": "complex64"}


@dataclass(frozen=True, slots=True)
class CauseAdvice:
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
    t = t or ""
    for scheme in ("https://", "http://"):  # JAX's doc links, glued on with no space
        while (i := t.find(scheme)) >= 0:
            j = i
            while j < len(t) and not t[j].isspace():
                j += 1
            t = t[:i].rstrip() + t[j:]
    for mark in ("{weak_type=True}", "{weak}"):
        while (i := t.find(mark)) >= 0:
            t = t[:i].rstrip() + " (weak)" + t[i + len(mark):]
    return t.replace("{weak_type=False}", "").strip()


def clean_text(text: str) -> str:
    """A cause description without JAX's doc URLs and raw ``weak_type`` notation."""
    return clean_type(text)


def torch_loaded(engines: str) -> bool:
    """Whether torch is loaded in the process, from its engines as the hook
    reports them (``ProcessRecord.engine``: ``jax,torch_compile``): the hook
    loads a torch engine whenever the program imports torch, so its
    ``DataLoader`` (``drop_last``) can be in play."""
    return any(e.strip().startswith("torch") for e in engines.split(","))


# A short last batch: what to do depends on where batches come from.
_SLICE = "skip the short last slice (range(0, n - batch + 1, batch))"
# (haiku's vae example batches with tf.data: there it is drop_remainder=True)
SHORT_LAST_SLICE = (f"Pad or bucket the last batch to the batch size, or drop it: {_SLICE}, "
                    "or drop_remainder=True where tf.data or grain batches it.")
SHORT_LAST_LOADER = ("Pad or bucket the last batch, or drop it: drop_last=True on torch's "
                     f"DataLoader, or, where the loop slices the data, {_SLICE}.")
_MARK_DYNAMIC = ("Bucket that dimension to a few fixed sizes, or mark it dynamic "
                 "(torch._dynamo.mark_dynamic(x, dim)).")

# (kind named, advice, expected) -------------------------------------------------------
Said = tuple[str, str, bool]
# The advice table: one entry per kind whose advice needs nothing but the kind.
ADVICE: dict[CauseKind, Said] = {
    K.FIRST_CALL: ("first call", "Nothing to do: every function compiles on its first call.",
                   True),
    K.WEAK_TYPE: ("weak type", "A Python scalar and a typed value alternate: pass a typed "
                  "value every time (jnp.float32(x)), or make the argument static.", False),
    K.SHARDING: ("sharding", "Make the input's sharding match what the step returns: "
                 "jax.device_put it once with that NamedSharding, or pin the step's output to "
                 "the input's (out_shardings, jax.lax.with_sharding_constraint).", False),
    K.DEVICE: ("sharding/device",
               "The array moved between devices (or between committed and uncommitted) since "
               "the last call: keep it on one device, device_put it once before the loop "
               "rather than on each call.", False),
    K.STATIC_VALUE: ("static argument", "Each new value of a static argument compiles again: "
                     "pass it as an array (a traced argument), or keep its values few.", False),
    K.STATIC_FUNCTION: ("static argument: function",
                        "Compiled once per distinct function passed (a jitted function taking "
                        "an activation or loss function as a static argument): expected "
                        "unless it changes every call.", True),
    K.FUNCTION_RECREATED: ("function re-created",
                           "The same function arrives as a new object (a lambda, closure or "
                           "functools.partial made anew on each call), and a static argument "
                           "compiles once per object: create it once, outside the loop, and "
                           "pass that same object every call.", False),
    K.PYTREE: ("pytree structure",
               "Keep the structure fixed: pass the same containers on every call (same dict "
               "keys, list lengths, None vs array in the same places).", False),
    K.REQUIRES_GRAD: ("requires_grad",
                      "The input needs grad on some calls and not on others (a model output vs "
                      "plain data, a missing .detach()): pass it with the same requires_grad "
                      "every call, and run evaluation under torch.no_grad().", False),
    K.STRIDE: ("memory layout (strides)", "The input arrives as another view (transposed, "
               "sliced): call .contiguous() on it before the compiled call.", False),
    K.TYPE_CHANGE: ("type change", "Pass the same type every call (always a tensor, not "
                    "sometimes a Python number or None).", False),
    K.SEQUENCE_LENGTH: ("sequence length", "A list or tuple argument changed length: Dynamo "
                        "unrolls it per length. Pass a fixed number of items, or stack them "
                        "into one tensor.", False),
    K.PYTHON_FLAG: ("Python bool flag", "Expected once per value: each value of a Python flag "
                    "compiles its own graph, cached after that.", True),
    K.MODULE_MODE: ("model.train()/model.eval() switch", "Expected once per mode: "
                    "train() and eval() compile their own graphs (dropout and batch norm run "
                    "differently), each cached after that, so switching back costs nothing. "
                    "Only a switch inside the compiled function would compile on every "
                    "call: set the mode outside it.", True),
    K.XLA_WARM_UP: ("warm-up", "Nothing to do: the first steps compile their graphs once.",
                    True),
    K.XLA_NEW_GRAPH: ("new input shapes", "torch_xla compiles a graph for every new input "
                      "shape: keep batch sizes fixed. " + SHORT_LAST_LOADER, False),
    K.XLA_VALUE_ACCESS: ("value access before sync",
                         "Move the .item() / print after torch_xla.sync(), or read the value "
                         "every N steps: each read cuts the step's graph there and waits for "
                         "the device.", False),
    K.XLA_CLOSURE_READ: ("value read in a step closure", "Nothing to change: a step closure "
                         "runs after torch_xla.sync(); its read compiles its own small graph "
                         "once per shape.", True),
    K.OTHER: ("other", "Keep input shapes, dtypes and static arguments fixed across steps.",
              False),
}
_CONTEXT: Said = ("config/context", "A context manager or config value differs between calls "
                  "and each one compiles again: enter it (or set it) once around the whole "
                  "loop, not around some calls.", False)
_MESH: Said = ("config/context: mesh", "The mesh in context differs between calls: enter the "
               "mesh once around the whole loop (with jax.set_mesh(mesh)), not around some "
               "calls.", False)


@dataclass(frozen=True, slots=True)
class _Ctx:
    """What the advice may depend on besides the cause."""

    second_site: bool  # seen at another call site than the function's first compile
    loader: bool  # torch is loaded: its DataLoader's drop_last is in play


def _at(t: str | None, dim: int | None) -> str | None:
    """A dimension's size out of a full type (``f32[4,3]``, 0 -> ``4``); the
    value as it is where it is not a type (Dynamo's bare sizes)."""
    s = shape_of(t)
    return s[1][dim] if s is not None and dim is not None and dim < len(s[1]) else t


def _batch(old: str, new: str, ctx: _Ctx, loader: bool) -> Said:
    if ctx.second_site:
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
    return ("short last batch", SHORT_LAST_LOADER if loader else SHORT_LAST_SLICE, False)


# Kinds whose advice depends on the cause's fields or the program: (cause, ctx) -> said.
def _said_batch(c: RecompileCause, ctx: _Ctx) -> Said:
    old, g = _at(c.before, 0) or ("1" if c.guard else "0"), bool(c.guard)
    new = _at(c.after, 0) or old
    # Dynamo's smaller batch is short at any call (a GAN's fake batch), but a batch
    # of one at another call than the first is a second caller's (a generation).
    short = (g and new.isdigit() and old.isdigit() and int(new) < int(old)
             and not (ctx.second_site and new == "1"))
    return _batch(old, new, replace(ctx, second_site=ctx.second_site > short), ctx.loader or g)


def _said_symbolic(c: RecompileCause, ctx: _Ctx) -> Said:
    """A dynamic batch's bound failed for a batch of one elsewhere: a second caller's."""
    if c.kind == K.SYMBOLIC_SHAPE and c.dim == 0 and c.after == "1" and ctx.second_site:
        return _batch(c.before or "2", "1", ctx, ctx.loader)
    return said_torch(c)


def _other_tensors(c: RecompileCause) -> bool:
    """A torch_xla new graph with other graph input/output counts than the
    last one at its line (the hook's ``before``/``after``): other tensors,
    not other shapes."""
    return bool(c.before and c.after and c.before != c.after)


def _said_xla_graph(c: RecompileCause, ctx: _Ctx) -> Said:
    if _other_tensors(c):
        return ("other graph inputs", "torch_xla compiles a graph for every new set of tensors "
                "the step reads and writes: create what the step keeps (optimizer state, "
                "buffers) before the loop, and keep the tensors it touches the same every "
                "step.", False)
    return ADVICE[K.XLA_NEW_GRAPH]


def _said_dtype(c: RecompileCause, ctx: _Ctx) -> Said:
    if c.guard:
        return ("dtype", "Cast the input to one dtype before the call "
                f"(x.to(torch.{_TORCH_DTYPES.get(c.before or '', c.before)})).", False)
    return ("dtype", "Cast the input to one dtype at the boundary, before the call "
            "(x.astype(dtype)), so every call sees the same dtype.", False)


def _said_global(c: RecompileCause, ctx: _Ctx) -> Said:
    if c.guard:  # Dynamo's words: the state that differs
        if "grad_mode" in c.name:
            return ("grad_mode", GRAD_MODE, True)
        return (f"global state: {c.name.split('(')[0]}",
                f"torch's global state ({c.name}) differs between calls: set it once for the "
                "whole loop (enter torch.autocast / set deterministic algorithms, default "
                "dtype, threads around all compiled calls or none).", False)
    if "grad_mode" in c.name:
        return ("global state: grad_mode",
                "Expected when evaluation runs under torch.no_grad(): it compiles its own "
                "graph once. Compile the eval step as its own function (or run it under "
                "no_grad every time) so training and evaluation do not retrace each other.",
                True)
    return ("global state", "Keep torch's global state (grad mode, autocast, deterministic "
            "algorithms, default dtype) the same on every call.", False)


def _said_identity(c: RecompileCause, ctx: _Ctx) -> Said:
    if c.guard:
        return ("object identity",
                "Dynamo guards on this object's identity: a function, lambda or module "
                "created anew each call recompiles. Create it once outside the loop and "
                "pass the same object (or make the value a tensor argument).", False)
    return ("object identity", "Dynamo guards on an object's identity: pass the same "
            "module/function object each call, or make the value a tensor argument.", False)


_SAID: dict[CauseKind, Callable[[RecompileCause, _Ctx], Said]] = {
    K.BATCH_SIZE: _said_batch,
    K.SHAPE_DIM: lambda c, ctx: ("shape change in a non-batch dimension", _MARK_DYNAMIC
                                 if c.guard else "Bucket that dimension to a few fixed sizes "
                                 "(pad to the next bucket).", False),
    K.RANK: lambda c, ctx: ("shape change (rank)", "Keep the input's rank fixed (reshape "
                            "before the call)." if c.guard else "Keep the argument's rank "
                            "fixed; bucket its sizes.", False),
    K.DTYPE: _said_dtype,
    K.CONFIG: lambda c, ctx: ("config", f"The option {c.name} differs between calls and each "
                              "value compiles again: set it once before the loop "
                              "(jax.config.update at start-up), not around some calls.", False),
    K.CONTEXT: lambda c, ctx: _MESH if "mesh" in c.name else _CONTEXT,
    K.GLOBAL_STATE: _said_global,
    K.OBJECT_IDENTITY: _said_identity,
    K.TENSOR_PROPERTY: lambda c, ctx: (c.name, f"Keep the input's {c.name} the same on every "
                                       "call.", False),
    K.PYTHON_NUMBER: lambda c, ctx: said_number(c),
    **dict.fromkeys((K.SYMBOLIC_SHAPE, K.INFERENCE_MODE, K.OBJECT_REPLACED), _said_symbolic),
    K.XLA_NEW_GRAPH: _said_xla_graph,
}


def _words(c: RecompileCause) -> str:
    """The cause in clean words: told from the fields where the engine's own
    words are Dynamo's or torch_xla's, else the hook's description."""
    k, arg = c.kind, c.argument
    if k in (K.XLA_WARM_UP, K.XLA_NEW_GRAPH) and c.sync is not None:
        if k == K.XLA_WARM_UP:
            return (f"new graph at sync {c.sync}, right after the last one at this line: "
                    "torch_xla's warm-up (state the first step created now lives on the device)")
        after = (f", {c.syncs_after} syncs after the last new graph at this line"
                 if c.syncs_after is not None else "")
        if _other_tensors(c):
            return (f"new graph at sync {c.sync}{after}, with other graph inputs or outputs "
                    f"({c.before} -> {c.after}): the step reads or writes other tensors "
                    "than before (state created or dropped, a new model part)")
        return (f"new graph at sync {c.sync}{after}, with the same graph inputs and outputs: "
                "the tensors' shapes changed: a short last batch, or a new batch size")
    if k == K.XLA_VALUE_ACCESS:
        return ("a tensor's value is read before torch_xla.sync() (.item(), print, if on a "
                "tensor)")
    if k == K.XLA_CLOSURE_READ:
        return "a tensor's value is read in a step closure, after torch_xla.sync()"
    if not c.guard:
        return clean_text(c.description)
    new = c.after or "another value"
    if k == K.REQUIRES_GRAD:
        old = (c.before or "").endswith("=1")
        return f"tensor '{arg}' requires_grad changed {old} -> {not old}"
    if k == K.DTYPE:
        return (f"tensor '{arg}' dtype changed {_TORCH_DTYPES.get(c.before or '', c.before)} -> "
                f"{_TORCH_DTYPES.get(c.after or '', c.after)}")
    if k == K.GLOBAL_STATE:
        return ("grad mode changed (torch.no_grad() around some calls, not others)"
                if "grad_mode" in c.name else f"global state changed: {c.name}")
    if k == K.TYPE_CHANGE:
        return f"'{arg}' changed type"
    if k in (K.INFERENCE_MODE, K.SYMBOLIC_SHAPE, K.OBJECT_REPLACED):
        return torch_words(c)
    if k == K.OBJECT_IDENTITY:
        return f"'{arg}' is another object than when compiled"
    if k == K.SEQUENCE_LENGTH:
        return f"len({arg}) changed {c.before} -> {new}"
    if k == K.MODULE_MODE:
        mode = {"True": "train()", "False": "eval()"}
        return (f"'{arg.removesuffix('.training')}' switched "
                f"{mode.get(c.before or '', c.before)} -> {mode.get(new or '', new)}")
    if k in (K.PYTHON_FLAG, K.PYTHON_NUMBER):
        return f"argument '{arg}' changed {c.before} -> {new}"
    exp, act = _at(c.before, c.dim), _at(c.after, c.dim)
    if c.dim is not None:
        return f"tensor '{arg}' {c.guard} mismatch at index {c.dim}: {exp} -> {act}"
    return f"tensor '{arg}' {c.guard} changed {exp} -> {act}"


def _also(text: str) -> tuple[str, str]:
    """``argument 'x' changed ... (also 'y')`` -> (the change, ``'y'``)."""
    i = text.rfind(" (also ")
    if i < 0 or not text.endswith(")") or "(" in text[i + 7:-1] or ")" in text[i + 7:-1]:
        return text, ""
    return text[:i], text[i + 7:-1]


# A pure function of records that stay the same objects from one snapshot to
# the next (the ledger's causes), asked for every cause at every scrape: cached
# (parsing it was two thirds of a Prometheus scrape of 1,000 graphs).
@functools.lru_cache(maxsize=8192)
def classify(cause: RecompileCause, first_site: str | None = None,
             engines: str = "") -> CauseAdvice:
    """The kind of ``cause`` with its clean text and advice. ``first_site`` is the
    call site of the function's first compile: a change seen at another site is a
    second caller (evaluation), not a short last batch. ``engines`` is the
    process's (``ProcessRecord.engine``): where torch is loaded the advice for a
    short last batch names ``drop_last=True`` (a cause of torch's own always does).

    ``text`` names the kind after the change and before the other arguments that
    changed with it: ``argument 'x' changed f32[2] -> f32[3] (batch size varies;
    also 'y')``."""
    c = typed(cause)
    ctx = _Ctx(bool(first_site and c.location and first_site != c.location),
               torch_loaded(engines))
    kind = CauseKind(c.kind)  # typed: a kind this version knows
    said = _SAID[kind](c, ctx) if kind in _SAID else ADVICE.get(kind, ADVICE[K.OTHER])
    words = _words(c)
    head, others = _also(words)
    more = f"; also {others}" if others else ""
    return CauseAdvice(said[0], f"{head} ({said[0]}{more})", words, said[1], said[2])


def warm_up(graphs_compiles: int, engine: str, causes: tuple[RecompileCause, ...] = ()) -> bool:
    """torch_xla compiles the first steps anew (step 0 has no optimizer state yet):
    new graphs at one site in the first steps are warm-up, not a recompile problem.
    Where the hook knows each new graph's sync, that decides; else a couple of
    graphs at one site count as warm-up."""
    if engine != "torch_xla":
        return False
    typed_causes = [typed(c) for c in causes]
    if typed_causes and all(c.sync is not None for c in typed_causes):
        return all(xla_warm_up(c.sync, c.syncs_after) for c in typed_causes
                   if c.sync is not None)
    return graphs_compiles <= 3


def xla_new_graph(cause: RecompileCause) -> bool:
    """A torch_xla graph compiled again at its line (warm-up, new shapes, a
    value read in the step, or where its sync is not known), not its first."""
    c = typed(cause)
    return c.kind in (K.XLA_WARM_UP, K.XLA_NEW_GRAPH, K.OTHER) or (
        c.kind == K.XLA_VALUE_ACCESS and c.sync is not None)


def typed(cause: RecompileCause) -> RecompileCause:
    """``cause`` with its kind: as the hook typed it, or read from an older
    hook's words."""
    return cause if cause.kind in _KNOWN else _typed_from_text(cause)


# --- causes from older hooks: their words, read back -----------------------------------
# The only prose parsed in the views (saved runs, peers from before the hooks typed
# their causes): Dynamo's guard failures and torch_xla's new graphs, as hooks wrote them.
_OLD_WORDS_RE = re.compile(
    r"^tensor '(?P<arg>[^']+)' (?P<what>size|stride|dtype|rank|requires_grad|device index"
    r"|dispatch key set) mismatch(?: at index (?P<i>\d+))?[.:]? expected (?P<exp>[^,]+?)"
    r"(?:, actual (?P<act>\S+))?$"
    r"|^GLOBAL_STATE changed: (?P<state>.+)$"
    r"|^___check_(?P<id>obj|type)_id\((?P<src>[^,]+),"
    r"|^(?P<len>len\()?(?P<vsrc>[^=()]+?)\)? == (?P<val>\S+)$"
    r"|^new graph at sync (?P<sync>\d+)(?:, (?P<after>\d+) syncs after)?"
    r"|size mismatch at index (?P<index>\d+)|invalidated because (?P<freed>.+?) got dealloc")
_TENSOR_KINDS = {"size": K.SHAPE_DIM, "stride": K.STRIDE, "dtype": K.DTYPE, "rank": K.RANK,
                 "requires_grad": K.REQUIRES_GRAD}


def _node(t: str) -> bool:
    """A pytree node as the JAX hook wrote it: ``dict('a', 'b')``, ``list of 3``, ``leaf``."""
    head = t.split("(", 1)[0] if t.endswith(")") else t
    name, _, n = head.partition(" of ")
    return name.isidentifier() and (not _ or n.isdigit())


def _typed_from_text(c: RecompileCause) -> RecompileCause:
    d, before, after = c.description, clean_type(c.before), clean_type(c.after)
    text, m = clean_text(d), _OLD_WORDS_RE.search(d)
    g = m.groupdict() if m else {}
    if "access tensor value before" in d:
        return replace(c, kind=K.XLA_VALUE_ACCESS)
    if g.get("sync"):
        sync, later = int(g["sync"]), int(g["after"]) if g.get("after") else None
        return replace(c, kind=K.XLA_WARM_UP if xla_warm_up(sync, later) else K.XLA_NEW_GRAPH,
                       sync=sync, syncs_after=later)
    if g.get("what"):
        what, i = g["what"], int(g["i"]) if g.get("i") else None
        kind = K.BATCH_SIZE if what == "size" and i == 0 else _TENSOR_KINDS.get(
            what, K.TENSOR_PROPERTY)
        return replace(c, kind=kind, guard=what, dim=i, argument=g["arg"], before=g["exp"],
                       after=g["act"], name=what if kind == K.TENSOR_PROPERTY else "")
    if g.get("freed"):  # a new object in the place of the one compiled for
        return replace(c, kind=K.OBJECT_REPLACED, guard="deallocated",
                       argument=re.sub(r"^[LG]\['([^']+)'\]", r"\1", g["freed"]))
    if g.get("state"):
        return replace(c, kind=K.GLOBAL_STATE, guard="GLOBAL_STATE", name=g["state"].strip())
    if g.get("id"):
        return replace(c, kind=K.TYPE_CHANGE if g["id"] == "type" else K.OBJECT_IDENTITY,
                       guard="id", argument=g["src"].strip())
    if g.get("val"):
        arg, val, new = c.argument or g["vsrc"], g["val"], c.after or "another value"
        kind = K.SEQUENCE_LENGTH if g.get("len") else K.PYTHON_NUMBER if val not in (
            "True", "False") else K.MODULE_MODE if arg.endswith(".training") else K.PYTHON_FLAG
        return replace(c, kind=kind, guard="==", argument=arg, before=val,
                       name="float" if "." in val or "." in new else "int")
    if d == FIRST_CALL:
        return replace(c, kind=K.FIRST_CALL)
    if text.startswith("static argument "):
        return replace(c, kind=static_kind(before, after))
    if text.startswith("argument ") and " moved " in text:
        return replace(c, kind=K.DEVICE)
    if before and after and (change := type_change(before, after)):
        return replace(c, kind=change[0], dim=change[1])
    if text.startswith("argument ") and " changed " in text and _node(before) and _node(after):
        return replace(c, kind=K.PYTREE)
    option = text.split(" ", 1)[0]
    if option.startswith("jax_") and text.startswith(f"{option} changed "):
        return replace(c, kind=K.CONFIG, name=option)
    if g.get("index"):
        return replace(c, kind=K.BATCH_SIZE if g["index"] == "0" else K.SHAPE_DIM,
                       dim=int(g["index"]))
    if "grad_mode" in d or "GLOBAL_STATE" in d or "global state" in d.lower():
        return replace(c, kind=K.GLOBAL_STATE, name="grad_mode" if "grad_mode" in d else "")
    if "Static(val=" in d:  # JAX's raw text, from a hook before the JAX forms
        return replace(c, kind=static_kind(before, after))
    if "pytree" in d:
        return replace(c, kind=K.PYTREE)
    if "sharding" in d.lower() or " sharded" in before + after:
        return replace(c, kind=K.SHARDING)
    if "mesh" in d or "context" in d.lower() or "config" in d.lower():
        return replace(c, kind=K.CONTEXT, name="mesh" if "mesh" in d else "")
    return replace(c, kind=K.OBJECT_IDENTITY if any(
        w in d for w in ("___check_obj_id", "ID_MATCH", " id ")) else K.OTHER)
