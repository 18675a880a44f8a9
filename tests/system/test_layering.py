"""The import graph of the four packages points one way (issue 16, "Done means").

Every ``.py`` file of ``tpu_info``, ``metrics``, ``profiler`` and ``tui`` is
parsed with :mod:`ast`; each ``import`` and ``from ... import`` (at module
level and inside functions alike: a lazy import is still a dependency; only
``if TYPE_CHECKING:`` blocks are left out) becomes an edge to the most
specific module file it names. Then:

* no cycle between files;
* ``tpu_info`` imports none of ``metrics``, ``profiler``, ``tui``;
* ``metrics`` imports neither ``profiler`` nor ``tui``;
* ``tui`` imports neither ``metrics`` nor ``profiler``;
* inside ``metrics``, engines feed recording: nothing under
  ``metrics.recording`` imports ``metrics.engines`` or ``metrics.export``,
  not even for type hints (recording declares what it reads of an engine).

``tpu-info run``'s start-up code (``profiler._autoinstall.sitecustomize``)
wires ``metrics`` and ``profiler`` together, so it lives in ``profiler``, the
one package allowed to import both: there are no exceptions to the layers.

And no module outside generated code is over :data:`MAX_LINES` lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("tpu_info", "metrics", "profiler", "tui")
# package -> packages it must never import
FORBIDDEN = {
    "tpu_info": ("metrics", "profiler", "tui"),
    "metrics": ("profiler", "tui"),
    "tui": ("metrics", "profiler"),
}
MAX_LINES = 500
# tpu_info's layers (docs/layout.md), lowest first: a module imports its own
# layer and the ones before it, never one after. The protos are the wire's
# generated half.
TPU_INFO_LAYERS = (("contract",), ("proto", "wire"), ("net", "host"), ("views",), ("outputs",),
                   ("commands",))
# What the hook may use of tpu_info: the contract and the wire, and five
# modules, each for one job (named here so a new one is a decision, not drift).
METRICS_MAY_USE = ("tpu_info.contract", "tpu_info.proto", "tpu_info.wire")
METRICS_ALSO = {
    "tpu_info.net.targets": "the one loopback set: binding decides what loopback means by it",
    "tpu_info.views.findings": "Prometheus' per-kind finding gauges come from the same rules",
    "tpu_info.outputs.textreport": "metrics_report() is the text report over the same views",
    "tpu_info.outputs.prometheus": "the endpoint serves the families the host exporter builds",
    "tpu_info.net.bounded_http": "the one bounded HTTP server: the hook's /metrics and the "
                                 "host exporter's (tpu-info exporter) serve through it",
    "tpu_info.net.webconfig": "the one web configuration file (TLS, basic auth) of both "
                              "/metrics endpoints",
    "tpu_info.outputs.summary": "the end-of-run summary a program that installed the hook "
                                "itself prints at exit (TPU_INFO_SUMMARY), as tpu-info run does",
}


def _generated(path: Path) -> bool:
    return path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))


def _files() -> Iterator[tuple[str, Path]]:
    """(module name, path) of every source file of the four packages."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if _generated(path):
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(tree: ast.AST, module: str, is_package: bool,
                    type_checking: bool = False) -> Iterator[str]:
    """Every module name ``tree`` imports (``from a import b`` yields ``a.b``:
    the caller falls back to ``a`` when ``b`` is a name defined in it);
    ``type_checking``: ``if TYPE_CHECKING:`` blocks' imports too."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node) and not type_checking:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                up = here[:len(here) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                yield f"{base}.{alias.name}" if base else alias.name
        stack.extend(ast.iter_child_nodes(node))


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """module -> the modules (of the four packages) it imports (``type_checking``:
    counting imports made for type hints only)."""
    files = dict(_files())
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for target in _imported_names(tree, name, path.name == "__init__.py", type_checking):
            if target.split(".")[0] not in PACKAGES:
                continue
            # `from a import b`: a.b when it is a module, else a (b is a name in it)
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _path(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """One cycle through ``start`` inside ``members`` (for the failure message)."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return [start]


def test_no_import_cycle_between_files() -> None:
    graph = import_graph()
    found = cycles(graph)
    shown = [" -> ".join(_path(graph, c[0], set(c))) for c in found]
    assert not found, "import cycles:\n" + "\n".join(shown)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_import_one_way(package: str) -> None:
    graph = import_graph()
    wrong = sorted(f"{src} imports {dst}" for src, dsts in graph.items()
                   if src.split(".")[0] == package
                   for dst in dsts if dst.split(".")[0] in FORBIDDEN[package])
    assert not wrong, "\n".join(wrong)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "tpu_info" or len(parts) < 2:
        return None
    return next((i for i, names in enumerate(TPU_INFO_LAYERS) if parts[1] in names), None)


def test_tpu_info_layers_import_downwards() -> None:
    graph = import_graph()
    wrong = []
    for src, dsts in graph.items():
        here = _layer(src)
        if here is None:
            continue
        for dst in dsts:
            there = _layer(dst)
            if there is not None and there > here:
                wrong.append(f"{src} imports {dst} (a later layer)")
    assert not wrong, "\n".join(sorted(wrong))
    unplaced = [m for m in graph if m.startswith("tpu_info.") and m.count(".") >= 1
                and _layer(m) is None and m not in ("tpu_info.__main__",)]
    assert not unplaced, f"modules outside every layer folder: {unplaced}"


# Inside metrics: sub-package -> sub-packages it must never import, even for type hints.
METRICS_FORBIDDEN = {"metrics.recording": ("metrics.engines", "metrics.export")}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("package", sorted(METRICS_FORBIDDEN))
def test_inside_metrics_engines_feed_recording(package: str) -> None:
    """Recording is read by engines and export, never the other way: the
    snapshot reads engines through :class:`metrics.recording.sources.Source`."""
    graph = import_graph(type_checking=True)
    wrong = sorted(f"{src} imports {dst}" for src, dsts in graph.items() if _under(src, package)
                   for dst in dsts if any(_under(dst, p) for p in METRICS_FORBIDDEN[package]))
    assert not wrong, "\n".join(wrong)


def test_metrics_uses_only_the_contract_and_the_wire_of_tpu_info() -> None:
    graph = import_graph()
    wrong = sorted(f"{src} imports {dst}" for src, dsts in graph.items()
                   if src.split(".")[0] == "metrics"
                   for dst in dsts if dst.split(".")[0] == "tpu_info"
                   and not dst.startswith(METRICS_MAY_USE) and dst not in METRICS_ALSO)
    assert not wrong, "\n".join(wrong)


def test_the_graph_sees_lazy_imports() -> None:
    """A function-level import counts (``metrics.track`` loads the JAX adapter lazily)."""
    graph = import_graph()
    assert "metrics.engines.jax" in graph["metrics"]
    assert "tpu_info.contract.model" in graph["tpu_info.views.values"]


def _over_limit() -> list[str]:
    over = []
    for package in (*PACKAGES, "tests", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if not _generated(path) and lines > MAX_LINES:
                over.append(f"{path.relative_to(ROOT)} ({lines})")
    return over


def test_no_module_over_500_lines() -> None:
    over = _over_limit()
    assert not over, "modules over 500 lines (split them by concern):\n" + "\n".join(over)


def test_import_metrics_loads_only_the_contract() -> None:
    """``import metrics`` in a program loads tpu_info's contract and nothing
    else of it, and no third-party package: the wire (protobuf, gRPC) loads
    when ``install()`` starts the server, views and outputs when a report is
    asked for, an engine's adapter with its engine. 11 tpu_info modules (was
    36, then 24 with the wire)."""
    code = ("import sys; before = set(sys.modules); import metrics; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    new = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    ours = [m for m in new if m.split(".")[0] == "tpu_info"]
    extra = [m for m in ours if m not in ("tpu_info", "tpu_info.contract")
             and not m.startswith("tpu_info.contract.")]
    assert extra == [], extra
    assert len(ours) <= 14, ours
    third_party = sorted({m.split(".")[0] for m in new} - set(sys.stdlib_module_names)
                         - {"metrics", "tpu_info"})
    assert third_party == [], third_party
