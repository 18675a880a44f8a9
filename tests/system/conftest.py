"""The one fleet (ranks, exporters, Prometheus with the fleet kit's rules)
that the slow Prometheus tests share: started once, for the first test that
asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.metrics.export.test_prometheus import prometheus_binary  # noqa: F401
from tests.system.fleet import Fleet, running_fleet


@pytest.fixture(scope="session")
def fleet(prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
          ) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet"), prometheus_binary) as f:
        yield f
