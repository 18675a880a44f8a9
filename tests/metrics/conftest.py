"""Fixtures of the hook tests: ``hooks`` installs the JAX hooks afresh."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import metrics


def install_hooks() -> Any:
    """The JAX hooks installed afresh; the recorder, reset."""
    metrics.uninstall()
    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    return rec


@pytest.fixture
def hooks() -> Iterator[Callable[[], Any]]:
    """``hooks()`` installs the JAX hooks afresh; reinstalled after."""
    yield install_hooks
    metrics.uninstall()
    metrics.install(engines=["jax"], serve=False).reset()
