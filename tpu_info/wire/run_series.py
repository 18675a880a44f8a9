"""A whole-run series off the wire (``tpu_info.v1.RunSeries``), validated.

A stranger's series is kept only when it is one a hook could send: at most
:data:`MAX_SERIES` buckets (the hook keeps
:data:`~tpu_info.contract.series.RUN_SERIES_BUCKETS`), finite numbers, each
bucket 1 to ``width`` samples, no more samples than its distribution
counts, each min at most its max and each first time at most its last;
otherwise it is left out with its reason (the rest of the snapshot stays).
Arrays of unequal length are structural nonsense (:class:`WireError`).

Example:
    >>> from tpu_info.proto import tpu_info_v1_pb2 as pb
    >>> from tpu_info.wire.decoding import Decoding
    >>> m = pb.RunSeries(width=2, first_unix=[1.0], last_unix=[2.0], counts=[2],
    ...                  totals=[3.0], mins=[1.0], maxs=[2.0])
    >>> read_series(m, 2, "StepTime series", Decoding()).count
    2
"""

from __future__ import annotations

import math

from tpu_info.contract.errors import WireError
from tpu_info.contract.series import RunSeries
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire.decoding import Decoding

MAX_SERIES = 1_024  # buckets of a whole-run series; the hook keeps 256 (RUN_SERIES_BUCKETS)


def read_series(m: pb.RunSeries, count: int, where: str, dec: Decoding) -> RunSeries | None:
    """A whole-run series, or None (the reason in ``left_out``) when it is
    more than a real hook sends or does not add up; arrays of unequal length
    are structural nonsense (:class:`WireError`)."""
    arrays = (m.first_unix, m.last_unix, m.counts, m.totals, m.mins, m.maxs)
    n = len(m.counts)
    if any(len(a) != n for a in arrays):
        raise WireError(f"{where}: its arrays differ in length "
                        f"({', '.join(str(len(a)) for a in arrays)})")
    why = ""
    if n > MAX_SERIES:
        why = f"{n:,} buckets, more than the {MAX_SERIES:,} a real program sends"
    elif not 1 <= m.width <= 2**62:
        why = f"bucket width {m.width}"
    else:
        r = RunSeries(m.width, m.first_unix, m.last_unix, m.counts, m.totals, m.mins, m.maxs)
        floats = (*r.first_unix, *r.last_unix, *r.totals, *r.mins, *r.maxs)
        if not all(map(math.isfinite, floats)):
            why = "a value that is not a finite number"
        elif any(c < 1 or c > r.width for c in r.counts) or r.count > count:
            why = f"bucket counts that do not add up (width {r.width:,}, count {count:,})"
        elif any(lo > hi for lo, hi in zip(r.mins, r.maxs, strict=True)) or any(
                a > b for a, b in zip(r.first_unix, r.last_unix, strict=True)):
            why = "a bucket whose min is above its max, or whose first time is after its last"
        else:
            return r
    dec.left_out(where, f"{why}; left out")
    return None
