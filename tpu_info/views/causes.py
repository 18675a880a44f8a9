"""Recompile causes in clean words: what kind of change it was and the advice for it.

The engines record causes in their own words (the JAX hook as ``argument 'x'
changed OLD -> NEW``, ``static argument 'mode' changed 2 -> 3``, ``argument 'x'
moved device 0 -> device 1``, ``jax_enable_x64 changed False -> True``;
Dynamo's guard failures; torch_xla's analysis). :func:`clean_text` strips what
only JAX's log needs (doc URLs, ``{weak_type=...}``); :func:`classify` names
the kind of change and the advice that fits it, and only that advice.

Advice fits how the program is written, from data it already carries: a
short last batch is told about ``drop_last=True`` only where torch (its
``DataLoader``) is loaded, read from the process's engines; a slicing loop
is told to skip or pad its short last slice. A static argument whose values
are functions (``<function relu at 0x..>``, ``<PjitFunction of ...>``,
``functools.partial(...)``: the recorded ``before``/``after`` values) compiles
once per distinct function, which is expected; a new object of the same
function on each call (a lambda or partial made in the loop) is not.

Example:
    >>> from tpu_info.contract.model import RecompileCause
    >>> c = RecompileCause(0.0, "argument 'x' changed f32[3] -> i32[3]", None, "x",
    ...                    "f32[3]", "i32[3]")
    >>> k = classify(c)
    >>> k.kind, k.text
    ('dtype', "argument 'x' changed f32[3] -> i32[3] (dtype)")
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from tpu_info.contract.model import FIRST_CALL, RecompileCause

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
# Dynamo's guard failures (torch.compile), after the compile id was stripped.
_DYNAMO_TENSOR_RE = re.compile(
    r"^tensor '(?P<arg>[^']+)' (?P<what>size|stride|dtype|rank|requires_grad|device index"
    r"|dispatch key set) mismatch(?: at index (?P<i>\d+))?[.:]? expected (?P<exp>[^,]+?)"
    r"(?:, actual (?P<act>\S+))?$")
_DYNAMO_GLOBAL_RE = re.compile(r"^GLOBAL_STATE changed: (?P<what>.+)$")
_DYNAMO_ID_RE = re.compile(r"^___check_(?P<what>obj|type)_id\((?P<src>[^,]+),")
_DYNAMO_VALUE_RE = re.compile(r"^(?P<len>len\()?(?P<src>[^=()]+?)\)? == (?P<val>\S+)$")
_TORCH_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16",
                 "BFloat16": "bfloat16", "Long": "int64", "Int": "int32", "Short": "int16",
                 "Char": "int8", "Byte": "uint8", "Bool": "bool", "ComplexFloat": "complex64"}


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


def _shape_kind(before: str, after: str, second_site: bool,
                loader: bool) -> tuple[str, str, bool] | None:
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
        return _batch_kind(bd[0], ad[0], second_site, loader)
    if len(bd) == len(ad) and bd[0] == ad[0]:
        return ("shape change in a non-batch dimension",
                "Bucket that dimension to a few fixed sizes (pad to the next bucket).", False)
    return ("shape change (rank)", "Keep the argument's rank fixed; bucket its sizes.", False)


def torch_loaded(engines: str) -> bool:
    """Whether torch is loaded in the process, from its engines as the hook
    reports them (``ProcessRecord.engine``: ``jax,torch_compile``): the hook
    loads a torch engine whenever the program imports torch, so its
    ``DataLoader`` (``drop_last``) can be in play."""
    return any(e.strip().startswith("torch") for e in engines.split(","))


# A short last batch: what to do depends on where batches come from.
_SLICE = "skip the short last slice (range(0, n - batch + 1, batch))"
SHORT_LAST_SLICE = f"Pad or bucket the last batch to the batch size, or {_SLICE}."
SHORT_LAST_LOADER = ("Pad or bucket the last batch, or drop it: drop_last=True on torch's "
                     f"DataLoader, or, where the loop slices the data, {_SLICE}.")


def _batch_kind(old: str, new: str, second_site: bool,
                loader: bool = False) -> tuple[str, str, bool]:
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
    return ("short last batch", SHORT_LAST_LOADER if loader else SHORT_LAST_SLICE, False)


_SHARDING = ("sharding", "device_put the inputs with one fixed sharding before the loop, and "
             "return outputs with the sharding the next call expects.", False)


# A pure function of records that stay the same objects from one snapshot to
# the next (the ledger's causes), asked for every cause at every scrape: its
# regular expressions were two thirds of a Prometheus scrape of 1,000 graphs.
@functools.lru_cache(maxsize=8192)
def classify(cause: RecompileCause, first_site: str | None = None,
             engines: str = "") -> CauseKind:
    """The kind of ``cause`` with its clean text and advice. ``first_site`` is the
    call site of the function's first compile: a change seen at another site is a
    second caller (evaluation), not a short last batch. ``engines`` is the
    process's (``ProcessRecord.engine``): where torch is loaded the advice for a
    short last batch names ``drop_last=True`` (a cause of torch's own always does).

    ``text`` names the kind after the change and before the other arguments that
    changed with it: ``argument 'x' changed f32[2] -> f32[3] (batch size varies;
    also 'y')``."""
    text = clean_text(cause.description)
    before, after = clean_type(cause.before), clean_type(cause.after)
    second_site = bool(first_site and cause.location and first_site != cause.location)
    torch_kind = _torch_kind(cause, second_site)
    if torch_kind is not None:
        text, kind = torch_kind[0], torch_kind[1:]
    else:
        kind = _kind(cause, text, before, after, second_site, torch_loaded(engines))
    also = _ALSO_RE.search(text)
    head = text[:also.start()] if also else text
    more = f"; also {also.group('others')}" if also else ""
    return CauseKind(kind[0], f"{head} ({kind[0]}{more})", text, kind[1], kind[2])


def _kind(cause: RecompileCause, text: str, before: str, after: str,
          second_site: bool, loader: bool) -> tuple[str, str, bool]:
    d = cause.description
    if d == FIRST_CALL:
        return ("first call", "Nothing to do: every function compiles on its first call.", True)
    if _STATIC_ARG_RE.match(text):
        return _static(before, after)
    if _MOVED_RE.match(text):
        return ("sharding/device",
                "The array moved between devices (or between committed and uncommitted) "
                "since the last call: keep it on one device, device_put it once before the "
                "loop rather than on each call.", False)
    if before and after and (k := _shape_kind(before, after, second_site, loader)):
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
            return _batch_kind(before or "0", after or "0", second_site, True) if before \
                and after else _batch_kind("1", "1", second_site, True)
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
        return _static(before, after)
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


# How Python shows a function (the values JAX's explanation records for a static
# argument): a def or lambda, a jitted function, a partial, a bound or built-in
# method, a custom_jvp/custom_vjp function (jax.nn.relu).
_CALLABLE_RE = re.compile(
    r"^(?:<(?:function|PjitFunction|bound method|built-in (?:function|method)|method) "
    r"|functools\.partial\(|<(?:[\w.]+\.)?custom_(?:jvp|vjp) object at )")
_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")


def is_function(value: str | None) -> bool:
    """``value`` (a static argument's value as recorded) is a function's repr."""
    return bool(value and _CALLABLE_RE.match(value))


def _static(before: str, after: str) -> tuple[str, str, bool]:
    if is_function(before) and is_function(after):
        # The same function at another address: a new object of it. A value cut
        # short ("...", the hook's bound on a value's length) cannot say so.
        if (_ADDRESS_RE.sub("", before) == _ADDRESS_RE.sub("", after)
                and not after.endswith("...")):
            return ("function re-created",
                    "The same function arrives as a new object (a lambda, closure or "
                    "functools.partial made anew on each call), and a static argument "
                    "compiles once per object: create it once, outside the loop, and pass "
                    "that same object every call.", False)
        return ("static argument: function",
                "Compiled once per distinct function passed (a jitted function taking "
                "an activation or loss function as a static argument): expected unless "
                "it changes every call.", True)
    return ("static argument",
            "Each new value of a static argument compiles again: pass it as an array "
            "(a traced argument), or keep its values few.", False)


_PYTREE = ("pytree structure",
           "Keep the structure fixed: pass the same containers on every call (same dict "
           "keys, list lengths, None vs array in the same places).", False)


def _torch_kind(cause: RecompileCause,
                second_site: bool) -> tuple[str, str, str, bool] | None:
    """A torch.compile guard failure or torch_xla's own cause -> (words, kind,
    advice, expected); None when the description is neither."""
    d = cause.description
    if (m := _XLA_NEW_GRAPH_RE.match(d)) is not None and "access tensor value before" not in d:
        step = int(m.group("step"))
        if _xla_warm_up(m):
            return (f"new graph at sync {step}, right after the last one at this line: "
                    "torch_xla's warm-up (state the first step created now lives on the device)",
                    "warm-up",
                    "Nothing to do: the first steps compile their graphs once.", True)
        after = f", {m.group('after')} syncs after the last new graph at this line" \
            if m.group("after") is not None else ""
        return (f"new graph at sync {step}{after}, with the same graph inputs and outputs: "
                "the tensors' shapes changed: a short last batch, or a new batch size",
                "new input shapes",
                "torch_xla compiles a graph for every new input shape: keep batch sizes "
                "fixed. " + SHORT_LAST_LOADER, False)
    if "access tensor value before" in d:
        return ("a tensor's value is read before torch_xla.sync() (.item(), print, if on a "
                "tensor)", "value access before sync",
                "Move the .item() / print after torch_xla.sync(), or read the value every N "
                "steps: each read cuts the step's graph there and waits for the device.", False)
    if m := _DYNAMO_TENSOR_RE.match(d):
        arg, what, exp, act = m.group("arg"), m.group("what"), m.group("exp"), m.group("act")
        if what == "requires_grad":
            old = exp.endswith("=1")
            return (f"tensor '{arg}' requires_grad changed {old} -> {not old}", "requires_grad",
                    "The input needs grad on some calls and not on others (a model output vs "
                    "plain data, a missing .detach()): pass it with the same requires_grad "
                    "every call, and run evaluation under torch.no_grad().", False)
        if what == "dtype":
            old, new = _TORCH_DTYPES.get(exp, exp), _TORCH_DTYPES.get(act or "", act)
            return (f"tensor '{arg}' dtype changed {old} -> {new}", "dtype",
                    f"Cast the input to one dtype before the call (x.to(torch.{old})).", False)
        words = (f"tensor '{arg}' {what} mismatch at index {m.group('i')}: {exp} -> {act}"
                 if m.group("i") is not None else f"tensor '{arg}' {what} changed {exp} -> {act}")
        if what == "size" and m.group("i") == "0":
            return (words, *_batch_kind(exp, act or exp, second_site, True))
        if what == "size":
            return (words, "shape change in a non-batch dimension",
                    "Bucket that dimension to a few fixed sizes, or mark it dynamic "
                    "(torch._dynamo.mark_dynamic(x, dim)).", False)
        if what == "rank":
            return (words, "shape change (rank)",
                    "Keep the input's rank fixed (reshape before the call).", False)
        if what == "stride":
            return (words, "memory layout (strides)",
                    "The input arrives as another view (transposed, sliced): call "
                    ".contiguous() on it before the compiled call.", False)
        return (words, what, f"Keep the input's {what} the same on every call.", False)
    if m := _DYNAMO_GLOBAL_RE.match(d):
        what = m.group("what").strip()
        if "grad_mode" in what:
            return ("grad mode changed (torch.no_grad() around some calls, not others)",
                    "grad_mode",
                    "Expected once per mode: training runs with grad and evaluation under "
                    "torch.no_grad() (or inference_mode), and each mode compiles its own graph "
                    "once. Keep no_grad()/model.eval() around the same calls every time; if the "
                    "mode flips inside one function, compile training and evaluation as two "
                    "functions.", True)
        return (f"global state changed: {what}", f"global state: {what.split('(')[0]}",
                f"torch's global state ({what}) differs between calls: set it once for the "
                "whole loop (enter torch.autocast / set deterministic algorithms, default "
                "dtype, threads around all compiled calls or none).", False)
    if m := _DYNAMO_ID_RE.match(d):
        src = m.group("src").strip()
        if m.group("what") == "type":
            return (f"'{src}' changed type", "type change",
                    "Pass the same type every call (always a tensor, not sometimes a Python "
                    "number or None).", False)
        return (f"'{src}' is another object than when compiled", "object identity",
                "Dynamo guards on this object's identity: a function, lambda or module "
                "created anew each call recompiles. Create it once outside the loop and "
                "pass the same object (or make the value a tensor argument).", False)
    if m := _DYNAMO_VALUE_RE.match(d):
        arg = cause.argument or m.group("src")
        new = cause.after or "another value"
        if m.group("len"):
            return (f"len({arg}) changed {m.group('val')} -> {new}", "sequence length",
                    "A list or tuple argument changed length: Dynamo unrolls it per length. "
                    "Pass a fixed number of items, or stack them into one tensor.", False)
        if m.group("val") in ("True", "False"):
            return (f"argument '{arg}' changed {m.group('val')} -> {new}", "Python bool flag",
                    "Expected once per value: each value of a Python flag compiles its own "
                    "graph, cached after that.", True)
        number = "float" if "." in m.group("val") or "." in new else "int"
        return (f"argument '{arg}' changed {m.group('val')} -> {new}",
                f"Python {number} specialized",
                f"Dynamo compiled the Python {number}'s first value into the graph, so a new "
                "value recompiled it (after that Dynamo treats it as dynamic, unless "
                "automatic_dynamic_shapes is off or Python branches on it: then every value "
                f"recompiles). Pass it as a tensor (torch.tensor({arg})), or compile with "
                "torch.compile(dynamic=True), to avoid the recompile.", False)
    return None


# torch_xla's first steps compile their own graphs (step 0 has no optimizer state).
WARM_UP_STEPS = 2
# The torch_xla hook's words for a new graph at a line, with the step it came in.
_XLA_NEW_GRAPH_RE = re.compile(
    r"^new graph at sync (?P<step>\d+)(?:, (?P<after>\d+) syncs after the last new graph "
    r"at this line)?(?: \((?P<io>[^)]*)\))?")


def warm_up(graphs_compiles: int, engine: str, causes: tuple[RecompileCause, ...] = ()) -> bool:
    """torch_xla compiles the first steps anew (step 0 has no optimizer state yet):
    new graphs at one site in the first steps are warm-up, not a recompile problem.
    Where the hook knows each new graph's step, that decides; else a couple of
    graphs at one site count as warm-up."""
    if engine != "torch_xla":
        return False
    steps = [_XLA_NEW_GRAPH_RE.match(c.description) for c in causes]
    if steps and all(steps):
        return all(_xla_warm_up(m) for m in steps if m)
    return graphs_compiles <= 3


def _xla_warm_up(m: re.Match[str]) -> bool:
    """A new graph in the step right after the last new graph at its line (or,
    where that is not known, in the first steps): warm-up."""
    if m.group("after") is not None:
        return m.group("after") == "0"
    return int(m.group("step")) <= WARM_UP_STEPS
