"""The checked-in generated protobuf code matches the .proto files."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("grpc_tools")

from tpu_info.proto import regen  # noqa: E402

PROTO_DIR = Path(regen.__file__).resolve().parent


@pytest.mark.slow
def test_generated_code_is_fresh(tmp_path: Path) -> None:
    written = regen.regenerate(tmp_path)
    stale = []
    for path in written:
        checked_in = PROTO_DIR / path.name
        if not checked_in.exists() or checked_in.read_bytes() != path.read_bytes():
            stale.append(path.name)
    assert not stale, (f"stale generated files {stale}: run "
                       "'python -m tpu_info.proto.regen' from the repository root")


def test_generated_modules_import_by_package_path() -> None:
    from tpu_info.proto import tpu_info_v1_pb2_grpc, tpu_metric_service_pb2_grpc

    assert tpu_metric_service_pb2_grpc.RuntimeMetricServiceStub
    assert tpu_info_v1_pb2_grpc.MonitorStub


def test_libtpu_descriptor_names_and_numbers() -> None:
    from tpu_info.proto import tpu_metric_service_pb2 as lpb

    svc = lpb.DESCRIPTOR.services_by_name["RuntimeMetricService"]
    assert svc.full_name == "tpu.monitoring.runtime.RuntimeMetricService"
    assert [m.name for m in svc.methods] == [
        "GetRuntimeMetric", "ListSupportedMetrics", "GetTpuRuntimeStatus"]
    metric = lpb.Metric.DESCRIPTOR
    assert {f.name: f.number for f in metric.fields} == {
        "attribute": 1, "start_timestamp": 7, "timestamp": 2, "gauge": 3, "counter": 4,
        "distribution": 5, "summary": 6}
    status = lpb.GetTpuRuntimeStatusResponse.DESCRIPTOR.fields_by_name["host_name"]
    assert status.containing_oneof.name == "_host_name"
