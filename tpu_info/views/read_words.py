"""The words of a read-back finding (``per_step_sync``): its advice by how
the value was read, and what the figure stands on where the device is the
host's own CPU."""

from __future__ import annotations

from tpu_info.contract.model import Snapshot
from tpu_info.views.slack import on_cpu

# Where a read every step goes is not recorded (a log line, a stop test, a
# constant): the advice names each case.
_TORCH_SYNC_ADVICE = ("Log every N steps if it is logged (or sum it on the device: total += "
                      "loss.detach(), one .item() at the end); test every N steps if it "
                      "decides when to stop; read it once before the loop if it never "
                      "changes.")


def cheap_sync_words(s: Snapshot) -> str:
    """Why a cheap read is still said, where the host computes (or on a device)."""
    if on_cpu(s):
        return ("It is cheap on this CPU, but on a GPU or TPU each read drains the pipeline: "
                "the host cannot queue the next step while this one runs.")
    return "It is cheap at this step time, but it keeps the host from running ahead."


def sync_advice(detail: str, engine: str = "jax") -> str:
    """What to do about a read every step, by how it was read (``detail``)."""
    if engine.startswith("torch"):
        return _TORCH_SYNC_ADVICE
    d = detail.lower()
    if "print" in d or "repr" in d or "str" in d or "format" in d:
        return ("Print every N steps, or use jax.debug.print inside the jitted function "
                "(it prints without stopping the host).")
    if "bool" in d or " if" in d or "control" in d:
        return ("Python control flow on a device value: branch on the device (jnp.where, "
                "lax.cond inside jit), or check it every N steps.")
    return ("Log every N steps if it is logged (or accumulate it with jnp and read once); "
            "test every N steps if it decides when to stop (or keep the test on the device: "
            "lax.while_loop); read it once before the loop if it never changes.")

