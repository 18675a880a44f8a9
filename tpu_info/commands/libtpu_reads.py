"""Asks libtpu for what only it serves, for the ``--metric`` names that need it.

A look reads libtpu's HBM, duty cycle and latencies with every other target
(:meth:`tpu_info.net.client.Client.libtpu`). Google's names also ask for
per-device gauges, multi-slice ``megascale`` distributions and each core's
runtime status (:data:`tpu_info.views.google_metrics.LIBTPU_SOURCES`): those
are asked here, only when such a name was given and only of the targets that
answered as libtpu, once per look. What each answered becomes a
:class:`~tpu_info.views.google_metrics.LibtpuRead`; the tables read those.

Example:
    >>> reads(["hbm_usage"], [], timeout=1.0)
    {}
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tpu_info.contract.errors import TpuInfoError
from tpu_info.net.client import Client
from tpu_info.proto import tpu_metric_service_pb2 as lpb
from tpu_info.views.google_metrics import (
    GOOGLE_METRICS,
    LIBTPU_SOURCES,
    GoogleMetric,
    LibtpuRead,
    Source,
)
from tpu_info.views.metrics import PERCENTILE_COLUMNS
from tpu_info.views.values import TargetView
from tpu_info.wire import libtpu_extra

SERVICE = "tpu.monitoring.runtime.RuntimeMetricService"


class _LibtpuClient(Client):
    """A :class:`Client` that also asks libtpu for one raw metric or its status."""

    def metric(self, name: str) -> lpb.MetricResponse | None:
        """libtpu's reply for ``name``; None when it does not serve it."""
        return self._libtpu_metric(name, required=False)

    def status(self, include_hlo_info: bool) -> lpb.GetTpuRuntimeStatusResponse:
        """``GetTpuRuntimeStatus``: each core's state."""
        req = lpb.GetTpuRuntimeStatusRequest(include_hlo_info=include_hlo_info)
        return self._call(self._libtpu.GetTpuRuntimeStatus, req, SERVICE)


def _read(c: _LibtpuClient, m: GoogleMetric) -> LibtpuRead:
    try:
        if m.source is Source.LIBTPU_STATUS:
            resp = c.status(include_hlo_info=m.key == "sequencers_detailed")
            return LibtpuRead(c.target, cores=libtpu_extra.cores_from_status(resp))
        got = c.metric(m.key)
        if got is None:
            return LibtpuRead(c.target, served=False)
        if m.source is Source.LIBTPU_GAUGE:
            return LibtpuRead(c.target, gauges=libtpu_extra.gauges_from_response(got))
        return LibtpuRead(c.target, latencies=libtpu_extra.latencies_from_response(
            got, sorted(PERCENTILE_COLUMNS.values())))
    except TpuInfoError as e:
        return LibtpuRead(c.target, error=str(e))


def reads(names: Sequence[str], views: Sequence[TargetView], timeout: float,
          deadline: float | None = None) -> dict[str, tuple[LibtpuRead, ...]]:
    """Google name -> what each libtpu target answered for it, for the names in
    ``names`` that only libtpu serves; nothing when no view is libtpu's."""
    wanted = [GOOGLE_METRICS[k] for k in dict.fromkeys(n.strip().replace(" ", "_")
                                                       for n in names)
              if k in GOOGLE_METRICS and GOOGLE_METRICS[k].source in LIBTPU_SOURCES]
    targets = [v.target for v in views if v.ok and v.source == "libtpu"]
    out: dict[str, list[LibtpuRead]] = {m.name: [] for m in wanted}
    if not wanted or not targets:
        return {}
    if deadline is None:
        deadline = time.monotonic() + timeout
    for target in targets:
        c = _LibtpuClient(target, timeout=timeout, deadline=deadline)
        try:
            for m in wanted:
                out[m.name].append(_read(c, m))
        finally:
            c.close()
    return {k: tuple(v) for k, v in out.items()}
