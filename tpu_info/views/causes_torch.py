"""Words and advice for the torch.compile guard kinds that need more than a
table entry: a dynamic dimension's guard (``16 <= x.size()[0]``, a growing
``idx.size()[1] != 64``, a slice's storage offset), the dispatch-key guard
of ``torch.inference_mode()``, a Python number Dynamo compiled in, the
advice for a ``grad_mode`` guard, and an object the graph was compiled for,
freed and replaced by a new one (a second optimizer). Read by :mod:`tpu_info.views.causes`.

Example:
    >>> from tpu_info.contract.model import RecompileCause
    >>> c = RecompileCause(0.0, "16 <= x.size()[0]", kind="symbolic_shape", guard="symbolic",
    ...                    argument="x", dim=0, name="size", before="16", after="8")
    >>> said_torch(c)[0]
    'batch size outside the compiled range (symbolic shape)'
"""

from __future__ import annotations

from tpu_info.contract.model import RecompileCause

# (kind named, advice, expected), as in causes.py.
Said = tuple[str, str, bool]

_SEQUENCE_GROWTH = ("Pad the growing dimension to a few bucket sizes (powers of two, or the "
                    "maximum length with a mask), or mark it dynamic from the first call "
                    "(torch._dynamo.mark_dynamic(x, dim)) without branching on its size.")


def said_torch(c: RecompileCause) -> Said:
    """A dynamic dimension's guard failed: the code (or Dynamo) assumed a
    bound on it, and this call's size lies beyond; or a tensor made under
    ``torch.inference_mode()`` met the graph of a normal one; or the object
    the graph was compiled for was freed and a new one came."""
    if c.kind == "inference_mode":
        return INFERENCE_MODE
    if c.kind == "object_replaced":
        return OBJECT_REPLACED
    if c.name == "storage_offset":
        return ("storage offset of a slice", "The input is a slice of a larger tensor whose "
                "offset Dynamo specialized (0 vs not): pass a contiguous copy (.clone()), or "
                "mark it unbacked as Dynamo suggests (torch._dynamo.decorators.mark_unbacked).",
                False)
    if c.dim == 0:
        return ("batch size outside the compiled range (symbolic shape)",
                "The batch dimension is dynamic, but the code or Dynamo assumed a bound on "
                "it, and a batch beyond it (a short last batch, often validation's) compiles "
                "again. Drop or pad the last batch (drop_last=True on torch's DataLoader), "
                "or avoid branching on x.size(0) in the compiled function.", False)
    return ("sequence length growth (symbolic shape)", _SEQUENCE_GROWTH, False)


def said_number(c: RecompileCause) -> Said:
    """A Python number Dynamo compiled into the graph took a new value."""
    number = c.name or "int"
    return (f"Python {number} specialized",
            f"Dynamo compiled the Python {number}'s first value into the graph, so a new "
            "value recompiled it (after that Dynamo treats it as dynamic, unless "
            "automatic_dynamic_shapes is off or Python branches on it: then every value "
            f"recompiles). Pass it as a tensor (torch.tensor({c.argument})), or compile with "
            "torch.compile(dynamic=True), to avoid the recompile.", False)


# Dynamo's grad_mode guard: training and evaluation each compile once.
GRAD_MODE = ("Expected once per mode: training runs with grad and evaluation under "
             "torch.no_grad() (or inference_mode), and each mode compiles its own graph "
             "once. Keep no_grad()/model.eval() around the same calls every time; if the "
             "mode flips inside one function, compile training and evaluation as two "
             "functions.")

INFERENCE_MODE: Said = ("inference mode", "Tensors made under torch.inference_mode() and "
                       "normal tensors reach the same compiled function, and each compiles its "
                       "own graph: run evaluation under torch.no_grad() instead (or always under "
                       "inference_mode), and compile the evaluation function separately from "
                       "the training step.", False)


# compile_opt_lr (pytorch/tutorials): a second Adam's compiled step compiled
# again, 18 % of the run; "keep input shapes fixed" did not fit.
OBJECT_REPLACED: Said = ("object replaced", "The compiled code was specialized on an object "
                        "(an optimizer, model or module) that was freed, and a new one took "
                        "its place: each new object compiles again. Create it once and reuse "
                        "it (one optimizer, one model and one compiled function for the whole "
                        "run).", False)


def torch_words(c: RecompileCause) -> str:
    """An inference-mode, symbolic-shape or replaced-object cause in words."""
    text = " ".join(c.description.split())
    if c.kind == "object_replaced":
        return (f"'{c.argument}' was freed and a new object took its place (the graph was "
                f"compiled for the old one: {text})")
    if c.kind == "inference_mode":
        return f"tensor '{c.argument}' changed {c.before} -> {c.after} (torch.inference_mode())"
    if c.name == "storage_offset":
        return f"tensor '{c.argument}' storage offset guard failed ({text})"
    size = f", this call's size {c.after}" if c.after else ""
    return (f"tensor '{c.argument}' dimension {c.dim} crossed the bound {c.before} the "
            f"compiled graph assumed ({text}{size})")
