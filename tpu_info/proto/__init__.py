"""Protocol files and their checked-in generated code.

* ``tpu_info_v1.proto``: tpu-info's own ``tpu_info.v1.Monitor`` service.
* ``tpu_metric_service.proto`` and ``tpu_telemetry.proto``: libtpu's
  ``tpu.monitoring.runtime.RuntimeMetricService``, wire-compatible with it.

Regenerate with ``python -m tpu_info.proto.regen`` from the repository root;
``tests/tpu_info/proto/test_proto_fresh.py`` fails when the checked-in copy is stale.

Example:
    >>> from tpu_info.proto import tpu_info_v1_pb2 as pb
    >>> pb.SnapshotRequest(events_since=3).events_since
    3
"""
