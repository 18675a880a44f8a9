"""The fleet kit (issue 17, item 3): Prometheus config, rules and Grafana
dashboard under ``examples/``.

promtool checks the config and the rules and runs the rules' unit tests
(each alert fires in one case and stays quiet in a near miss); then every
PromQL expression of the dashboard (template variables replaced by the
values the fleet has) and of the rule files (as the real Prometheus loaded
them) is run against :mod:`tests.system.fleet`'s Prometheus, which scrapes
real exporters over real hooked JAX programs, and must return data: the
fleet is built so that each alert's condition holds somewhere in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.system.fleet import RULES, Fleet

EXAMPLES = ROOT / "examples"
DASHBOARD = EXAMPLES / "grafana" / "tpu-info-dashboard.json"
RULE_TESTS = EXAMPLES / "prometheus" / "tpu-info-rules.test.yml"
ALERTS = ("TpuInfoRecompileStorm", "TpuInfoPerStepHostSync", "TpuInfoHbmNearFull",
          "TpuInfoRankGraphSkew", "TpuInfoRankStepTimeSkew", "TpuInfoHookErrors",
          "TpuInfoTargetDown", "TpuInfoExporterDown")
RATE_INTERVAL = "20s"  # $__rate_interval: the fleet scrapes every second
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        msg = "promtool is not on PATH: install the Debian package 'prometheus'"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def test_promtool_checks_the_config_and_rules_and_runs_their_unit_tests():
    promtool = _promtool()
    checks = [["check", "config", str(EXAMPLES / "prometheus" / "prometheus.yml")],
              ["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]]
    for args in checks:
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120,
                              cwd=RULE_TESTS.parent)
        print(" ".join(["promtool", *args[:2], Path(args[2]).name]), done.stdout, done.stderr)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout + done.stderr
    tests = RULE_TESTS.read_text()
    for alert in ALERTS:  # each alert has its case (and the near miss beside it)
        assert re.search(rf"alertname: {alert}\n\s+exp_alerts:\n\s+- exp_labels", tests), alert
        assert f"alert: {alert}\n" in RULES.read_text(), alert


def _targets(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every query target, rows' panels included."""
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        for t in panel.get("targets", []):
            yield panel["title"], t["expr"]


def _annotations(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(name, expr) of every Prometheus annotation query."""
    for a in dashboard["annotations"]["list"]:
        if a.get("datasource", {}).get("type") == "prometheus":
            yield a["name"], a["expr"]


def test_the_dashboard_marks_recompiles():
    """Issue 30, item 6: a Grafana annotation on every panel where a process
    compiled a new graph, over the same variables as the panels, its title
    and text made of labels its query keeps."""
    dash = json.loads(DASHBOARD.read_text())
    [recompiles] = [a for a in dash["annotations"]["list"] if a["name"] == "Recompiles"]
    assert recompiles["enable"] and not recompiles["hide"]
    assert recompiles["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    expr = recompiles["expr"]
    assert "increase(tpu_info_uncached_compile_total{" in expr and expr.endswith("> 0")
    assert 'job=~"$job"' in expr and 'host=~"$host"' in expr
    kept = set(re.search(r"sum by \(([^)]*)\)", expr)[1].replace(" ", "").split(","))
    used = set(re.findall(r"\{\{(\w+)\}\}", recompiles["textFormat"]
                          + recompiles["titleFormat"]))
    assert used <= kept and set(recompiles["tagKeys"].split(",")) <= kept, (used, kept)


def test_the_dashboard_is_provisionable():
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "host", "rank"} <= set(variables)
    ids = []
    stack = list(dash["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        ids.append(panel["id"])
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    assert len(ids) == len(set(ids))
    exprs = [e for _, e in _targets(dash)]
    for name in ("tpu_info_mark_step_total", "tpu_info_step_time_seconds",
                 "tpu_info_uncached_compile_total", 'kind=~"recompile_.*"',
                 "tpu_info_outbound_data_bytes", "tpu_info_device_memory_used_bytes",
                 "tpu_info_device_busy_time_seconds_total", "tpu_info_hook_errors_total",
                 "tpu_info_target_up", "up{"):
        assert any(name in e for e in exprs), name


def _values(fleet: Fleet, query: str) -> list[str]:
    m = _LABEL_VALUES.match(query)
    assert m, query
    found = {s["metric"].get(m["label"]) for s in fleet.query(m["selector"])}
    return sorted(v for v in found if v)


def _substitute(expr: str, chosen: dict[str, list[str]]) -> str:
    """Grafana's interpolation of a multi-value variable in a regex matcher."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, values in chosen.items():
        expr = expr.replace(f"${name}", "(" + "|".join(re.escape(v) for v in values) + ")")
    return expr


@pytest.mark.slow
def test_every_query_of_the_dashboard_and_the_rules_returns_data(fleet: Fleet):
    dash = json.loads(DASHBOARD.read_text())
    chosen: dict[str, list[str]] = {}
    for v in dash["templating"]["list"]:
        if v["type"] == "query":  # each variable's values, given the ones before it
            chosen[v["name"]] = _values(fleet, _substitute(v["query"]["query"], chosen))
            assert chosen[v["name"]], v
    assert chosen["host"] == ["hostA", "hostB"] and chosen["rank"] == ["0", "1", "2", "3"]

    rules = [r for g in _rule_groups(fleet) for r in g["rules"]]
    assert len(rules) == RULES.read_text().count(" expr: "), "Prometheus left rules out"
    assert {r["name"] for r in rules if r["type"] == "alerting"} == set(ALERTS)
    pending = {f"{p}: {e}": _substitute(e, chosen) for p, e in _targets(dash)}
    pending.update({f"annotation {n}: {e}": _substitute(e, chosen)
                    for n, e in _annotations(dash)})
    pending.update({f"rule {r['name']}": r["query"] for r in rules})
    # and Prometheus's rule engine holds each alert (pending: their `for` is minutes)
    pending.update({f"ALERTS {a}": f'ALERTS{{alertname="{a}"}}' for a in ALERTS})
    deadline = time.monotonic() + 45  # rate() over [5m] needs two scrapes; rules, a round
    while pending and time.monotonic() < deadline:
        for what, expr in list(pending.items()):
            if fleet.query(expr):
                del pending[what]
        time.sleep(1)
    assert not pending, "no data: " + "\n".join(pending) + "\n" + fleet.log.read_text()[-1500:]
    for r in rules:
        assert r["health"] == "ok", r


def _rule_groups(fleet: Fleet) -> list[dict]:
    """The rules as the running Prometheus loaded them (with their health)."""
    url = f"http://127.0.0.1:{fleet.api_port}/api/v1/rules"
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["groups"]
