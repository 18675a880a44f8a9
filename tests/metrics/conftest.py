"""Fixtures of the hook tests: ``hooks`` installs the C hot path or the
Python hooks (``metrics.recording.native.NATIVE`` is set before install,
which is when the hooks are made)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import metrics
from metrics.recording import native


def install_kind(kind: str) -> Any:
    """The JAX hooks installed afresh with the C hot path ("C") or without
    ("Python"); the recorder, reset."""
    if kind == "C" and native.built() is None:
        pytest.skip("the C hot path is not built here")
    metrics.uninstall()
    native.NATIVE = native.built() if kind == "C" else None
    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    return rec


@pytest.fixture
def hooks() -> Iterator[Callable[[str], Any]]:
    """``hooks("C")`` / ``hooks("Python")``: installs that kind; restored after."""
    was = native.NATIVE
    yield install_kind
    metrics.uninstall()
    native.NATIVE = was
    metrics.install(engines=["jax"], serve=False).reset()
