"""What the JAX hook reports as its versions (the header and doctor read them)."""

from __future__ import annotations


def test_libtpu_version_is_reported_once_the_backend_loaded_it(fresh_metrics, monkeypatch):
    # On the TPU machine libtpu sits outside site-packages (no distribution
    # metadata): the header read "libtpu N/A" and doctor "no libtpu package
    # here" while JAX ran on it. The hook reports the module JAX loaded.
    import sys
    import types

    import metrics

    metrics.install(serve=False)
    (engine,) = [e for e in metrics.installed_engines() if e.name == "jax"]
    monkeypatch.delitem(sys.modules, "libtpu", raising=False)
    assert "libtpu" not in engine.versions()
    monkeypatch.setitem(sys.modules, "libtpu", types.SimpleNamespace(__version__="0.0.42.1"))
    assert engine.versions()["libtpu"] == "0.0.42.1"
