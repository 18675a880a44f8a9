"""One engine registry and one typed engine protocol (issue 16, "Decisions in
the wrong room").

A new engine is one entry in :data:`metrics.engines.registry.ENGINES` plus
its adapter: ``install()`` (by name and "auto", before and after its import),
the ``tpu-info run`` bootstrap's watch list and the profiler's device traces
all see it with nothing else changed. Callers use the
:class:`metrics.engines.Engine` methods, never ``hasattr``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

import metrics
from metrics import engines
from metrics.engines import Engine, EngineBase, device_profilers, importwatch, registry
from metrics.engines.device_profilers import DeviceWindow
from metrics.engines.registry import EngineSpec
from metrics.recording.snapshot import build
from tests.conftest import ROOT
from tpu_info.contract.model import SiteReading

ADAPTER = '''
from metrics.engines.base import EngineBase
import tpu_info_fake_lib  # the "engine": importing the adapter imports it

class FakeEngine(EngineBase):
    name = "fake"

    def __init__(self, recorder):
        super().__init__()
        self.installed = False

    def install(self):
        self.installed = True

    def uninstall(self):
        self.installed = False

    def blind_spots(self):
        return ["the fake engine sees nothing"]

def create(recorder, explain_cache_misses=True):
    return FakeEngine(recorder)
'''


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """One more registry entry, its adapter and its library on a private path."""
    (tmp_path / "tpu_info_fake_adapter.py").write_text(textwrap.dedent(ADAPTER))
    (tmp_path / "tpu_info_fake_lib.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = EngineSpec("fake", trigger="tpu_info_fake_lib", adapter="tpu_info_fake_adapter")
    monkeypatch.setattr(registry, "ENGINES", (*registry.ENGINES, spec))
    waiting_before = set(metrics._waiting)
    yield spec
    with metrics._lock:  # as before: nothing of this test waits or stays hooked
        engine = metrics._installed.pop("fake", None)
        if engine is not None:
            engine.uninstall()
        for name in set(metrics._waiting) - waiting_before:
            metrics._waiting.discard(name)
            importwatch.cancel(registry.spec(name).trigger)
    importwatch.cancel("tpu_info_fake_lib")
    for name in ("tpu_info_fake_adapter", "tpu_info_fake_lib"):
        sys.modules.pop(name, None)


def _bootstrap():  # type: ignore[no-untyped-def]
    """The ``tpu-info run`` bootstrap as a module (not armed: no TPU_INFO_AUTOINSTALL)."""
    path = ROOT / "profiler" / "_autoinstall" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("tpu_info_bootstrap_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_entry_reaches_install_the_watcher_and_the_profiler(fake_engine, tmp_path) -> None:
    assert "fake" in engines.valid_names()
    assert "tpu_info_fake_lib" in _bootstrap().watched()
    assert _bootstrap().watched() == registry.triggers()
    # "auto" before the engine's import: waits for its trigger, hooks it at the import.
    metrics.install(serve=False)
    assert "fake" in metrics.waiting_engines()
    import tpu_info_fake_lib  # noqa: F401

    hooked = {e.name: e for e in metrics.installed_engines()}
    assert "fake" in hooked and hooked["fake"].installed
    # No device profiler of its own: a device capture says so and goes on.
    window = DeviceWindow([hooked["fake"]], tmp_path / "dev")
    window.start()
    assert window.stop() == []
    assert window.notes == ["device trace: the fake engine has no device profiler here"]
    assert "fake" not in metrics.waiting_engines()
    # The typed defaults answer what the adapter does not define.
    snap = metrics.snapshot()
    assert "the fake engine sees nothing" in snap.blind_spots


def test_install_by_name_loads_the_adapter(fake_engine) -> None:
    metrics.install(engines=["fake"], serve=False)
    assert any(e.name == "fake" and e.installed for e in metrics.installed_engines())
    with pytest.raises(ValueError, match="fake"):  # the message lists it among valid names
        metrics.install(engines=["nope"], serve=False)


def test_every_adapter_is_an_engine_base() -> None:
    """Each registered adapter (a module, or a package whose front door
    offers its ``create``) defines a subclass of EngineBase and a ``create``
    (read from the source: loading them would import torch and torch_xla)."""
    for spec in registry.ENGINES:
        base = ROOT / Path(*spec.adapter.split("."))
        if base.is_dir():  # a package: its parts define them, its __init__ offers create
            assert "create" in (base / "__init__.py").read_text(), spec.adapter
            source = "".join(p.read_text() for p in sorted(base.rglob("*.py")))
        else:
            source = base.with_suffix(".py").read_text()
        assert "(EngineBase):" in source, spec.adapter
        assert "\ndef create(" in source, spec.adapter


def test_callers_use_methods_not_hasattr() -> None:
    for path in ("metrics/__init__.py", "metrics/recording/snapshot.py"):
        source = (ROOT / path).read_text()
        for name in ("extra_readings", "sites", "steps", "blind_spots", "clear_readings"):
            assert f'hasattr(e, "{name}")' not in source, path
            assert f'getattr(e, "{name}"' not in source, path


class _Broken(EngineBase):
    name = "broken"

    def install(self) -> None: ...

    def uninstall(self) -> None: ...

    def sites(self) -> list[SiteReading]:
        raise RuntimeError("boom")


def test_defaults_and_a_failing_reading(fresh_metrics) -> None:
    e = _Broken()
    assert isinstance(e, Engine)
    assert (e.steps(), e.blind_spots(), e.devices(), e.versions()) == (None, [], [], {})
    before = fresh_metrics.registry.counter_value("HookErrors") or 0
    snap = build(fresh_metrics, [e])  # a failing reading is counted, never raised
    assert snap.sites == ()
    assert (fresh_metrics.registry.counter_value("HookErrors") or 0) == before + 1


def test_registry_entries_are_whole() -> None:
    names = [e.name for e in registry.ENGINES]
    assert len(names) == len(set(names))
    for e in registry.ENGINES:
        assert all(s in names for s in e.superseded_by), e
        assert dataclasses.is_dataclass(e) and e.trigger and e.adapter.startswith("metrics.")
    # Device traces are the adapter's (issue 32, item 4), not a registry entry.
    from metrics.engines.jax import JaxEngine

    assert JaxEngine.device_trace_kind is device_profilers.JaxTrace
