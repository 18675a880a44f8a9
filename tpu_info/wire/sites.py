"""The diagnosis sections of a ``tpu_info.v1.Snapshot``: sites, steps and
blind spots (what the hook saw the program do at its own lines, how many
steps it ran, and what the hook could not see).

Example:
    >>> from tpu_info.wire.decoding import Decoding
    >>> from tpu_info.contract.model import SiteReading, Snapshot
    >>> from tpu_info.proto import tpu_info_v1_pb2 as pb
    >>> msg = pb.Snapshot()
    >>> fill_diagnosis(msg, Snapshot(1.0, sites=(SiteReading("sync", "t.py:3", 7),)))
    >>> read_diagnosis(msg, Decoding())[0][0].count
    7
"""

from __future__ import annotations

from tpu_info.contract.model import SiteReading, Snapshot, StepsReading
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire.decoding import Decoding, text

MAX_SITES = 1_024  # the hook keeps at most 256 per kind
MAX_BLIND_SPOTS = 64


def fill_diagnosis(msg: pb.Snapshot, s: Snapshot) -> None:
    """Writes ``s``'s sites, steps and blind spots into ``msg``."""
    for site in s.sites:
        msg.sites.add(kind=site.kind, location=site.location, count=site.count,
                      bytes=site.bytes, seconds=site.seconds, function=site.function,
                      detail=site.detail, last_seen_unix=site.last_seen_unix,
                      first_seen_unix=site.first_seen_unix, phase=site.phase, via=site.via,
                      occurrences=site.occurrences, steps_spanned=site.steps_spanned,
                      drain_seconds=site.drain_seconds, timed=site.timed,
                      timed_bytes=site.timed_bytes, work=site.work, gaps=site.gaps,
                      gap_seconds=site.gap_seconds, within=site.within,
                      in_generator=site.in_generator, estimated=site.estimated,
                      interval_share=site.interval_share)
    st = s.steps
    if st is not None:
        msg.steps.count = st.count
        msg.steps.source = st.source
        msg.steps.basis = st.basis
        if st.seconds_total is not None:
            msg.steps.seconds_total = st.seconds_total
        if st.first_unix is not None:
            msg.steps.first_unix = st.first_unix
        if st.last_unix is not None:
            msg.steps.last_unix = st.last_unix
        msg.steps.excluded_calls = st.excluded_calls
        msg.steps.loop_ended = st.loop_ended
        msg.steps.step_line = st.step_line
    msg.blind_spots.extend(s.blind_spots)


def _site(m: pb.Site, dec: Decoding) -> SiteReading:
    where = f"site {text(m.location)!r}"
    return SiteReading(
        kind=text(m.kind), location=text(m.location), count=m.count, bytes=m.bytes,
        seconds=max(0.0, dec.num0(m.seconds, where, "seconds")),
        function=text(m.function), detail=text(m.detail),
        last_seen_unix=dec.when(m.last_seen_unix, where, "last_seen_unix"),
        first_seen_unix=dec.when(m.first_seen_unix, where, "first_seen_unix"),
        phase=text(m.phase), via=text(m.via), occurrences=m.occurrences,
        steps_spanned=m.steps_spanned,
        drain_seconds=(max(0.0, dec.num0(m.drain_seconds, where, "drain_seconds"))
                       if m.HasField("drain_seconds") else None),
        timed=m.timed, timed_bytes=m.timed_bytes,
        work=text(m.work), gaps=m.gaps, within=text(m.within), in_generator=m.in_generator,
        estimated=m.estimated,
        gap_seconds=(max(0.0, dec.num0(m.gap_seconds, where, "gap_seconds"))
                     if m.HasField("gap_seconds") else None),
        interval_share=(max(0.0, dec.num0(m.interval_share, where, "interval_share"))
                        if m.HasField("interval_share") else None),
    )


def read_diagnosis(m: pb.Snapshot, dec: Decoding) -> tuple[
        tuple[SiteReading, ...], StepsReading | None, tuple[str, ...]]:
    """``(sites, steps, blind_spots)`` of a message, validated and bounded."""
    sites = tuple(_site(x, dec) for x in dec.bounded(m.sites, MAX_SITES, "sites"))
    steps = None
    if m.HasField("steps"):
        total = dec.opt(m.steps, "seconds_total", "steps")
        first, last = (dec.when(getattr(m.steps, f), "steps", f)
                       if m.steps.HasField(f) else None for f in ("first_unix", "last_unix"))
        steps = StepsReading(count=m.steps.count, source=text(m.steps.source),
                             basis=text(m.steps.basis),
                             seconds_total=None if total is None else max(0.0, total),
                             first_unix=first or None, last_unix=last or None,
                             excluded_calls=m.steps.excluded_calls,
                             loop_ended=m.steps.loop_ended,
                             step_line=text(m.steps.step_line))
    blind = dec.strings(m.blind_spots, MAX_BLIND_SPOTS, "blind_spots")
    return sites, steps, blind
