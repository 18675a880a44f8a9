"""One config module names every ``TPU_INFO_*`` variable (issue 16, item 1:
"export: one config module for every TPU_INFO_* variable").

Every variable the code, the README or the documentation mentions is in
:data:`metrics.config.VARIABLES`; the table in ``docs/environment.md`` is the
module's table; no code but the config module reads one by a literal name (the three
places ``metrics`` cannot reach use the same names); and the parses say what
is wrong in one line.
"""

from __future__ import annotations

import ast
import re

import pytest

from metrics import config
from tests.conftest import ROOT

NAME = re.compile(r"TPU_INFO_[A-Z][A-Z0-9_]*[A-Z0-9]")
SOURCES = ("metrics", "profiler", "tpu_info", "tui")
# Where a variable is named outside the config module, and why.
ELSEWHERE = {
    # tpu_info never imports metrics: the CLI reads the discovery directory too.
    "tpu_info/contract/discovery_record.py": {"ENV_RUNTIME_DIR": config.RUNTIME_DIR},
    # tpu_info never imports metrics: `tpu-info run` sets the bootstrap's flag.
    # and chooses where its child saves the run, to print the child's summary.
    "tpu_info/commands/run.py": {"ENV_FLAG": config.AUTOINSTALL, "ENV_SAVE": config.SAVE,
                                 "ENV_SUMMARY": config.SUMMARY},
    # The bootstrap runs before `metrics` may be imported.
    "profiler/_autoinstall/sitecustomize.py": {"ENV_FLAG": config.AUTOINSTALL},
}


def _sources() -> list[tuple[str, str]]:
    out = []
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                out.append((path.relative_to(ROOT).as_posix(), path.read_text()))
    return out


def test_every_variable_mentioned_is_in_the_config_module() -> None:
    known = {v.name for v in config.VARIABLES}
    docs = [(p.relative_to(ROOT).as_posix(), p.read_text())
            for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]]
    texts = [*_sources(), *docs]
    unknown = sorted({f"{where}: {name}" for where, text in texts
                      for name in NAME.findall(text) if name not in known})
    assert not unknown, "not in metrics/config.py:\n" + "\n".join(unknown)


def test_the_docs_table_is_the_config_modules() -> None:
    page = (ROOT / "docs" / "environment.md").read_text()
    assert config.docs_table() in page, (
        "docs/environment.md's table of environment variables differs from "
        "metrics.config.docs_table():\n" + config.docs_table())


def test_only_the_config_module_names_a_variable_in_code() -> None:
    """A string that is exactly a variable's name is a read or a write of it:
    only the config module has those (and the places in :data:`ELSEWHERE`,
    whose constants must equal the config's)."""
    wrong = []
    for where, text in _sources():
        if where == "metrics/config.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and NAME.fullmatch(node.value):
                allowed = ELSEWHERE.get(where, {})
                if node.value not in {v.name for v in allowed.values()}:
                    wrong.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not wrong, "read through metrics.config instead:\n" + "\n".join(wrong)
    import profiler._autoinstall.sitecustomize as boot  # not armed: no TPU_INFO_AUTOINSTALL
    from tpu_info.commands import run
    from tpu_info.contract import discovery_record as discovery

    assert discovery.ENV_RUNTIME_DIR == config.RUNTIME_DIR.name
    assert run.ENV_FLAG == boot.ENV_FLAG == config.AUTOINSTALL.name
    assert (run.ENV_SAVE, run.ENV_SUMMARY) == (config.SAVE.name, config.SUMMARY.name)


def test_every_variable_says_what_unset_means() -> None:
    names = [v.name for v in config.VARIABLES]
    assert len(names) == len(set(names))
    for v in config.VARIABLES:
        assert v.default and v.meaning and "|" not in v.meaning + v.default, v


@pytest.mark.parametrize("raw, expected", [("", None), (" 0 ", 0), ("65535", 65535)])
def test_port_parse(raw: str, expected: int | None) -> None:
    assert config.port(config.PORT, {"TPU_INFO_PORT": raw}) == expected


@pytest.mark.parametrize("raw, message", [("http", "must be a port number, got 'http'"),
                                          ("70000", "must be in 0..65535, got 70000")])
def test_a_bad_port_is_one_line_naming_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^TPU_INFO_PROMETHEUS_PORT {message}$"):
        config.port(config.PROMETHEUS_PORT, {"TPU_INFO_PROMETHEUS_PORT": raw})


def test_flags_and_serve_words(caplog) -> None:
    assert [config.flag(config.DEVICE_CAPTURE, {"TPU_INFO_DEVICE_CAPTURE": w})
            for w in ("1", "TRUE", "yes", "0", "", "on")] == [True] * 3 + [False] * 3
    assert config.serve({}) == "process" and config.serve({"TPU_INFO_SERVE": "1"}) == "thread"
    assert config.serve({"TPU_INFO_SERVE": "sideways"}) == "process"
    assert "TPU_INFO_SERVE='sideways' is not one of" in caplog.text
