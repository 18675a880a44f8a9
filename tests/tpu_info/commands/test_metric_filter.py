"""``-f`` takes Google tpu-info's filter grammar, its own --help example included."""

from __future__ import annotations

import pytest
from rich.console import Console

from tpu_info.outputs.metric_tables import metric_table
from tpu_info.views.metrics import DEFAULT_PERCENTILES, parse_filter


@pytest.mark.parametrize("text,cols", [
    ("percentile:[p50,p90], core_type:tensorcore", ("p50", "p90")),  # Google's --help example
    ("core_type:tensorcore, percentile:[p99]", ("p99",)),
    ("percentile:[ p50 , P999 ]", ("p50", "p999")),
    ("core_type:sparse_core", DEFAULT_PERCENTILES),  # no percentile key: the default columns
])
def test_google_grammar(text: str, cols: tuple[str, ...]):
    assert parse_filter(text) == cols


@pytest.mark.parametrize("text,needle", [
    ("p50", "is not KEY:VALUE"),
    ("", "is empty"),
    ("percentile:[p50], color:red", "unknown key 'color'"),
    ("core_type:gpu", "core_type must be one of"),
    ("percentile:p50", "takes a list"),
    ("percentile:[p101]", "percentiles must be among"),
])
def test_bad_filters_say_what_is_wrong(text: str, needle: str):
    with pytest.raises(ValueError, match=needle):
        parse_filter(text)


def test_no_targets_says_so_and_keeps_the_title_whole():
    console = Console(width=120, record=True)
    console.print(metric_table("host_to_device_transfer_latency", [], ("p50",)))
    out = console.export_text()
    assert "host_to_device_transfer_latency\n" in out  # not wrapped to the table's width
    assert "No hooked processes found." in out
