"""The shared vocabulary lives in the contract, once: event kinds and
severities are enums that keep their wire strings, metric names are
:mod:`tpu_info.contract.catalog` constants, and the capture record, ``CaptureBusy``
and the loopback names are each defined in one place."""

from __future__ import annotations

import ast
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import profiler
import profiler.remote
from tpu_info.contract import catalog, errors
from tpu_info.contract.model import Event, Finding, Snapshot
from tpu_info.net.targets import is_loopback_host, normalize
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire import codec as wire
from tpu_info.wire import encoder

# Event.kind's strings on the wire (what EventKind's members must encode to).
KINDS = ("compile", "recompile", "cache_hit", "transfer_to_device", "transfer_from_device",
         "step", "hook_error", "graph_break")

ROOT = Path(__file__).resolve().parents[3]
# Where names are used rather than defined (the engines read their own
# libraries' counters, which share torch_xla's names).
USERS = ("tpu_info", "tui", "profiler", "metrics/export", "metrics/recording/snapshot.py",
         "metrics/recording/recorder.py")


def _sources(*roots: str) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        base = ROOT / root
        for path in sorted([base] if base.suffix == ".py" else base.rglob("*.py")):
            if "_pb2" not in path.name:
                yield path.relative_to(ROOT), ast.parse(path.read_text(), str(path))


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes (examples may name things as users do)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def _strings(tree: ast.Module) -> Iterator[ast.Constant]:
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip:
            yield node


def test_event_kinds_and_severities_keep_their_wire_strings() -> None:
    from tpu_info.contract.model import EventKind, Severity

    assert tuple(k.value for k in EventKind) == KINDS
    assert [s.value for s in Severity] == ["error", "warning", "info"]
    e = Event(seq=1, time_unix=1.0, kind=EventKind.RECOMPILE, name="jit(f)")
    s = Snapshot(taken_at_unix=1.0, events=(e,), last_seq=1)
    plain = pb.Snapshot.FromString(wire.snapshot_to_proto(s).SerializeToString())
    assert plain.events[0].kind == "recompile"
    assert encoder.snapshot_to_bytes(s) == wire.snapshot_to_proto(s).SerializeToString()
    back = wire.snapshot_from_proto(plain).events[0]
    assert back.kind == EventKind.RECOMPILE and f"{e.kind}" == "recompile"
    assert json.dumps({"kind": e.kind, "severity": Severity.WARNING}) == \
        '{"kind": "recompile", "severity": "warning"}'


def test_a_finding_maps_its_severity_once() -> None:
    from tpu_info.contract.model import Severity

    assert Finding("m").severity is Severity.WARNING
    assert Finding("m", "info").severity is Severity.INFO
    assert Finding("m", "error").severity.label == "FAIL"
    assert Finding("m", "newer-hook-level").severity is Severity.INFO  # shown as info
    assert [s.label for s in Severity] == ["FAIL", "warn", "info"]


def test_metric_names_are_catalog_constants_outside_the_catalog() -> None:
    names = {v for k, v in vars(catalog).items() if k.isupper() and isinstance(v, str)}
    found = [f"{path}:{node.lineno}: {node.value!r}"
             for path, tree in _sources(*USERS) if path.name != "catalog.py"
             for node in _strings(tree) if node.value in names]
    assert not found, "use the tpu_info.contract.catalog constant:\n" + "\n".join(found)


def test_event_kinds_are_compared_as_enum_members() -> None:
    kinds = set(KINDS)

    def literal_kinds(node: ast.AST) -> list[str]:
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in kinds]

    found = []
    for path, tree in _sources(*USERS, "metrics/recording/events.py"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
                    found += [f"{path}:{node.lineno}: {k!r}"
                              for s in sides for k in literal_kinds(s)]
            elif isinstance(node, ast.Dict) and len(node.keys) > 1:  # kind -> label tables
                keyed = [k for key in node.keys if key is not None for k in literal_kinds(key)]
                if len(keyed) == len(node.keys):
                    found += [f"{path}:{node.lineno}: {k!r}" for k in keyed]
    assert not found, "use tpu_info.contract.model.EventKind:\n" + "\n".join(found)


def test_loopback_names_are_listed_once() -> None:
    found = []
    for path, tree in _sources("tpu_info", "tui", "profiler", "metrics"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Set | ast.Tuple | ast.List) and path.name != "targets.py":
                loop = [e.value for e in node.elts if isinstance(e, ast.Constant)
                        and isinstance(e.value, str) and e.value and is_loopback_host(e.value)]
                if len(loop) > 1:
                    found.append(f"{path}:{node.lineno}: {loop}")
    assert not found, "use tpu_info.net.targets.is_loopback_host / normalize:\n" + "\n".join(found)
    for spelling in ("localhost", "127.0.0.1", "[::1]", "ip6-localhost", "[::ffff:127.0.0.1]"):
        assert normalize(f"{spelling}:8431") == "localhost:8431", spelling
    assert normalize("10.0.0.1:8431") == "10.0.0.1:8431"


def test_one_capture_record_and_one_capture_busy() -> None:
    assert profiler.CaptureBusy is errors.CaptureBusy
    from tpu_info.contract.captures import RemoteCapture

    assert errors.CaptureBusy("a capture is running").grpc_status == "ABORTED"
    out = profiler.remote.capture(0.05, device=False, stop=threading.Event())
    assert type(out) is RemoteCapture and out.files == () and out.trace.startswith(b"{")
    from metrics.export import helper, server
    from tpu_info.net import client

    assert client.RemoteCapture is RemoteCapture
    assert server.CaptureFn.__args__[-1] is RemoteCapture  # type: ignore[attr-defined]
    assert not [n for n in vars(helper) if "Capture" in n and n not in
                ("CaptureFile", "RemoteCapture", "CaptureFn")]
