"""The read side of the JAX transfer hook: its site table, per user line.

:class:`~metrics.engines.jax.implicit.ImplicitTransfers` folds each
implicit transfer into a site (one per kind, code object and instruction
offset, at most ``MAX_SITES_PER_KIND`` per kind, the rest in one overflow
site). Here, at read time only, the sites are folded first, their lines
found (once per site), merged per line (several instructions of one line
are one line) and read out as :class:`~tpu_info.contract.model.SiteReading`\\ s
(:func:`readings`) or as the sync lines steps are inferred from
(:func:`sync_lines`); :func:`blind_spots` says what the hook cannot see.

Example (what a site reads as)::

    SiteReading(kind="sync", location="/w/train.py:88", count=120, bytes=480,
                seconds=0.002, function="train", detail="float()")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from metrics.engines._frames import call_instruction
from metrics.engines.generators import in_generator
from metrics.engines.jax.kinds import CALL, EAGER_OP, GET, IMPLICIT_H2D, SYNC
from tpu_info.contract.diagnosis import PeriodicWork
from tpu_info.contract.model import INDEXING_OPS, SiteKind, SiteReading

if TYPE_CHECKING:
    from metrics.engines.jax.implicit import ImplicitTransfers

# The kinds a site is kept under (the journal's record kinds: kinds.py; an
# untimed host->device record is kept as IMPLICIT_H2D).
SITE_KINDS = (SYNC, IMPLICIT_H2D, EAGER_OP, CALL, GET)
OTHER_SITES = "(other sites)"
NO_USER_FRAME = "(no user frame)"
OVERFLOW = "more lines than kept"  # the detail of the overflow site

_GENERIC = {SYNC: "device->host read", IMPLICIT_H2D: "host->device transfer",
            EAGER_OP: "eager op", CALL: "jitted call", GET: "jax.device_get"}
_KIND_NAMES = {SYNC: SiteKind.SYNC.value, IMPLICIT_H2D: SiteKind.IMPLICIT_TO_DEVICE.value,
               EAGER_OP: SiteKind.EAGER_OP.value, CALL: SiteKind.CALL.value,
               GET: SiteKind.DEVICE_GET.value}


class Steps(NamedTuple):
    """The steps one site's records of a batch ran in, in order: how many
    times the step changed (the first record counts), the first and last."""

    runs: int
    first: int
    last: int


def grouped_steps(steps: np.ndarray, inv: np.ndarray, m: int) -> list[Steps]:
    """:class:`Steps` per site of a batch: ``steps`` per record (in order),
    ``inv`` its site (0 .. ``m - 1``)."""
    order = np.argsort(inv, kind="stable")
    g, s = inv[order], steps[order]
    new = np.ones(g.size, bool)  # a record in another step (or site) than the one before
    new[1:] = (s[1:] != s[:-1]) | (g[1:] != g[:-1])
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # each site's first, sites in order
    lasts = np.r_[starts[1:], g.size] - 1
    runs = np.bincount(g, weights=new, minlength=m).astype(np.int64)
    return [Steps(*t) for t in zip(runs.tolist(), s[starts].tolist(), s[lasts].tolist(),
                                   strict=True)]


def instruction_groups(keys: np.ndarray, code_of: Callable[[int], CodeType | None],
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(each group's first row, each row's group) of records keyed by rows of
    ``keys`` (``(id(code), offset * 8 + kind)``; ``code_of(row)``: its code):
    a call's records at its CALL join those at its PRECALL
    (:func:`~metrics.engines._frames.call_instruction`), their keys changed
    in place. Fold time, a code object's bytes read once per group."""
    def groups() -> tuple[np.ndarray, np.ndarray]:
        _, first, inv = np.unique(keys.view(np.dtype((np.void, 16))).ravel(),
                                  return_index=True, return_inverse=True)
        return first, inv

    first, inv = groups()
    shift = []
    for row, key in zip(first.tolist(), keys[first, 1].tolist(), strict=True):
        code = code_of(row)
        shift.append(0 if code is None else (key >> 3) - call_instruction(code, key >> 3))
    if not any(shift):
        return first, inv
    keys[:, 1] -= np.array(shift, np.int64)[inv] * 8
    return groups()


def noted_at(table: dict[tuple[int, int], Any], code: CodeType, offset: int) -> Any:
    """What ``table`` (``{(id(code), offset): value}``, offsets as recorded)
    holds for the instruction at ``offset``, or at the CALL it stands for."""
    got = table.get((id(code), offset))
    if got is None and call_instruction(code, offset + 4) == offset:
        got = table.get((id(code), offset + 4))
    return got


def known_steps(steps: np.ndarray, inv: np.ndarray, m: int) -> list[Steps | None]:
    """:func:`grouped_steps` of the records whose step was known (``steps``
    >= 0; -1: before the step function was guessed), per site; None for a
    site with none. One such record (an op in the loop's first step) must not
    hide the batch's other steps: a fold mid-loop (a read, a compile) would
    leave the line only the steps of later batches (14 of 40: "periodic")."""
    out: list[Steps | None] = [None] * m
    known = steps >= 0
    if known.any():
        sites = inv[known]
        present = np.unique(sites)
        for k, st in zip(present.tolist(), grouped_steps(
                steps[known], np.searchsorted(present, sites), present.size), strict=True):
            out[k] = st
    return out


class SyncLine(NamedTuple):
    """One line's device->host syncs (monotonic ns), for steps inferred from
    them: ``(last_end - first_end) / (count - 1)`` is the time between two."""

    location: str
    detail: str
    count: int  # type: ignore[assignment]  # the field, over tuple.count
    ns: int  # host time inside the syncs
    first_end: int
    last_end: int


def readings(impl: ImplicitTransfers) -> list[SiteReading]:
    """One reading per line (per kind) that synced or moved data implicitly
    under ``impl`` (an ``ImplicitTransfers``), locations resolved now, each
    with the library call it went through (``via``: ``flax nnx.jit``; see
    :meth:`ImplicitTransfers.via`); the overflow as one entry."""
    to_unix = impl.rec.mono_to_unix
    lines = by_line(impl)
    gaps = gap_lines(impl)
    return [SiteReading(kind=_KIND_NAMES[kind], location=location, count=count,
                        bytes=nbytes, seconds=ns / 1e9, function=function,
                        detail=", ".join(kept_names(details)),
                        last_seen_unix=last_end / 1e9 + to_unix,
                        first_seen_unix=first_end / 1e9 + to_unix, via=via,
                        occurrences=min(count, occurrences),
                        steps_spanned=max(0, last_step - first_step) if first_step >= 0 else 0,
                        drain_seconds=drain / 1e9 if kind == SYNC else None,
                        timed=timed if kind == IMPLICIT_H2D else 0,
                        timed_bytes=timed_bytes if kind == IMPLICIT_H2D else 0,
                        in_generator=generator, **gaps.get((kind, location), {}))
            for (kind, location), (count, nbytes, ns, first_end, last_end, function, details,
                                   via, occurrences, first_step, last_step, drain, timed,
                                   timed_bytes, generator)
            in lines.items()]


def kept_names(details: list[str], most: int = 4) -> list[str]:
    """A line's first ``most`` details, and an indexing primitive's name
    among them (:data:`~tpu_info.contract.model.INDEXING_OPS`: the views'
    advice reads it) where the line's other instructions' names came first
    (``jnp.reshape(...)[idx]``: reshape's call, then the subscript's gather).

    >>> kept_names(["reshape", "transpose", "add", "select_n", "gather"])
    ['reshape', 'transpose', 'add', 'gather']
    """
    out = details[:most]
    if not INDEXING_OPS.intersection(out):
        out[-1:] = [d for d in details[most:] if d in INDEXING_OPS][:1] or out[-1:]
    return out


def gap_lines(impl: ImplicitTransfers) -> dict[tuple[int, str], dict[str, Any]]:
    """(kind, location) -> the loop's gaps it led or sat in, as
    :class:`SiteReading` fields (``work``, ``gap_seconds``, ``gaps``,
    ``within``): :mod:`metrics.engines.jax.gaps`, read after :func:`by_line`
    (which resolved each site's line)."""
    g = getattr(impl, "gaps", None)
    if g is None:
        return {}
    held = list(impl._sites.items())
    kind_of = {id(site): key[0] for key, site in held}
    out: dict[tuple[int, str], dict[str, Any]] = {}
    step = impl.context.step_owner
    called = g.called_in(step)
    owners = [o for by in list(impl.context.owners.values()) for o in list(by.values())]
    by_name = {o.name: o for o in owners}
    # Gaps whose functions' output the step takes are its input's making;
    # not an evaluation's handing the state back (flax's nnx.jit returns the
    # model's state: optax's cifar10_resnet's eval_step was said as input).
    inputs = {id(lead) for name, lead in called.items()
              if step in getattr(by_name.get(name), "feeds", ())
              and not getattr(by_name.get(name), "evaluation", False)}
    for site, gs in list(g.sites_of(step).items()):
        if site.where is None or id(site) not in kind_of:
            continue
        row = out.setdefault((kind_of[id(site)], site.where[0]), {})
        if gs.gaps:
            row["work"] = (PeriodicWork.INPUT.value if id(site) in inputs
                           and gs.work == PeriodicWork.EVALUATION else gs.work)
            row["gaps"] = row.get("gaps", 0) + gs.gaps
            row["gap_seconds"] = row.get("gap_seconds", 0.0) + g.own(gs, step) / 1e9
        elif gs.within is not None and gs.within.where is not None:
            row["within"] = gs.within.where[0]
    if called:  # a gap's functions' numpy arguments (counted apart) sat in it
        name_of = {o.numpy_label: o.name for o in owners}
        for key, site in held:
            name = name_of.get(site.detail or "", "")
            lead = called.get(name) if name != getattr(step, "name", None) else None
            if (key[0] == IMPLICIT_H2D and lead is not None and site.where is not None
                    and lead.where is not None and lead.where[0] != site.where[0]):
                out.setdefault((IMPLICIT_H2D, site.where[0]), {}).setdefault(
                    "within", lead.where[0])
    return out


def sync_lines(impl: ImplicitTransfers) -> list[SyncLine]:
    """Device->host syncs per line of the user's code (not the overflow
    entry, nor syncs with no user frame), with their first and last time."""
    return [SyncLine(location, ", ".join(details[:4]), count, ns, first, last)
            for (kind, location), (count, _, ns, first, last, _, details, *_)
            in by_line(impl).items()
            if kind == SYNC and location not in (OTHER_SITES, NO_USER_FRAME)]


def by_line(impl: ImplicitTransfers) -> dict[tuple[int, str], list[Any]]:
    """(kind, location) -> [count, bytes, ns, first end, last end, function,
    details, via, occurrences, first step, last step, drain ns, timed records,
    timed bytes, in a generator (:func:`~.generators.in_generator`)]: ``impl``'s
    sites merged per line, folded first. A line's occurrences are its
    instructions' (:func:`line_occurrences`; 0 for eager ops, whose count
    is already the times their line ran)."""
    impl.journal.flush()
    for feeder in impl.feeders:  # other hooks' journals that fold into the table
        feeder.flush()
    merged: dict[tuple[int, str], list[Any]] = {}
    spans: dict[tuple[int, str], list[tuple[int, int, int]]] = {}  # per line, its instructions'
    with impl._lock:
        held = [(k[0], s) for k, s in impl._sites.items()]
        held += list(impl._other.items())
        rows = [(kind, s, s.detail, s.count, s.bytes, s.ns, s.first_end, s.last_end,
                 s.occurrences, s.first_step, s.last_step, s.drain_ns, s.timed, s.timed_bytes)
                for kind, s in held]
    for (kind, site, detail, count, nbytes, ns, first_end, last_end, occurrences, first_step,
         last_step, drain, timed, timed_bytes) in rows:
        generator = False
        if detail == OVERFLOW:
            location, function, via = OTHER_SITES, "", ""
        else:
            if site.where is None:  # the line is found once per site
                site.where = where(site.code, site.offset)
            if site.via is None:  # and the library call it went through
                site.via = impl.via(site.code, site.offset)
            location, function = site.where
            via = site.via
            generator = in_generator(site.code)  # a flag read (an expression's: kept once)
        row = merged.get((kind, location))
        detail = detail or _GENERIC[kind]
        # An eager site's detail is its primitives' names, ", "-joined.
        details = detail.split(", ") if kind == EAGER_OP else [detail]
        first_end = last_end if first_end is None else first_end
        spans.setdefault((kind, location), []).append((first_step, last_step, occurrences))
        if row is None:
            merged[(kind, location)] = [count, nbytes, ns, first_end, last_end, function,
                                        details, via, occurrences, first_step, last_step, drain,
                                        timed, timed_bytes, generator]
            continue
        row[12] += timed
        row[13] += timed_bytes
        row[11] += drain
        row[0] += count
        row[1] += nbytes
        row[2] += ns
        row[3] = min(row[3], first_end)
        row[4] = max(row[4], last_end)
        row[6].extend(d for d in details if d not in row[6])
        row[7] = row[7] or via
        row[14] = row[14] or generator
        row[8] = max(row[8], occurrences)
        if first_step >= 0:  # -1: no step told (eager ops)
            row[9] = first_step if row[9] < 0 else min(row[9], first_step)
            row[10] = max(row[10], last_step)
    for key, line in spans.items():
        if len(line) > 1:
            merged[key][8] = line_occurrences(line)
    return merged


def line_occurrences(spans: list[tuple[int, int, int]]) -> int:
    """The steps a line ran in, from its instructions' (first step, last
    step, occurrences): one after another they add up (two calls on one
    line, each in its own stretch of the run), one less where
    the next begins in the step the previous ended; side by side (two reads
    of one line each time) the busiest one's. An instruction's occurrences
    closer together than the busiest one's interval are one: the step
    index can move within one occurrence while the step function is still
    being guessed (an evaluation's two calls at step 0, each once the step).

    >>> line_occurrences([(1, 101, 3), (101, 601, 11)])
    13
    >>> line_occurrences([(1, 601, 13), (1, 601, 13)])
    13
    >>> line_occurrences([(1, 2, 2), (51, 201, 4)])
    5
    """
    first_b, last_b, n_b = max(spans, key=lambda x: x[2])
    every = (last_b - first_b) // (n_b - 1) if n_b > 1 and first_b >= 0 else 0
    total, end = 0, -1
    for first, last, n in sorted(spans):
        if first < 0:  # no step told (eager ops): its own count
            total = max(total, n)
            continue
        if every > 0:
            n = min(n, 1 + (last - first) // every)
        if first >= end:
            total += n - (first == end)
            end = last
        else:
            total, end = max(total, n), max(end, last)
    return total


def where(code: CodeType | None, offset: int) -> tuple[str, str]:
    """``("/abs/file.py:LINE", function)`` of an instruction (read time only)."""
    if code is None:  # no frame outside the libraries (a library's own thread)
        return NO_USER_FRAME, ""
    line = code.co_firstlineno
    for start, end, ln in code.co_lines():
        if start <= offset < end:
            if ln is not None:
                line = ln
            break
    path = code.co_filename
    if not path.startswith("<"):
        path = os.path.abspath(path)
    return f"{path}:{line}", getattr(code, "co_qualname", code.co_name)


def blind_spots(impl: ImplicitTransfers) -> list[str]:
    """What ``impl`` (an ``ImplicitTransfers``) cannot see in this process,
    one sentence each."""
    import jax

    from metrics.engines.jax.devices import backends_started

    out = list(impl.missing)
    try:  # (never the call that starts a backend: see backends_started)
        platforms = {d.platform for d in jax.local_devices()} if backends_started() else set()
    except Exception:  # noqa: BLE001 - no backend yet: say nothing about it
        platforms = set()
    if "cpu" in platforms:
        out.append("np.asarray(x), np.array(x), x.item() and memoryview(x) of a jax.Array "
                   "on CPU read it through numpy's zero-copy buffer protocol: np.asarray(x) "
                   "and np.array(x) of a name are counted as sampled device->host syncs at "
                   "their line between steps (a per-step read), the rest are not counted")
    if impl.jit_arguments.jit_hooked():
        out.append("numpy arguments of functions jitted before metrics.install() are moved "
                   "to one device in C++ and are not counted (nor numpy leaves in "
                   "containers at places a compiling call did not have them)")
    else:
        out.append("numpy arguments of jitted functions running on one device are moved "
                   "in C++ and are not counted (only the first call of each signature "
                   "is seen)")
    out.append("numpy operands of eager jnp operations (jnp.sin(a), x + a with a numpy "
               "array a) are moved in C++ after the first call and are not counted")
    return out
