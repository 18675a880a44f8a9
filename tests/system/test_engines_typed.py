"""``metrics/engines`` is typed: mypy, with the project's configuration
(``[tool.mypy]`` in pyproject.toml), finds no error in it (issue 32, item 2).

The engines are judged, not what they import: ``--follow-imports=silent``
reads ``metrics.recording``, ``tpu_info`` and the engines' libraries for
their types and reports errors only in ``metrics/engines``. One test per
part, so a failure says whose it is: the shared modules (``base``,
``registry``, ``importwatch``, ...), ``torch/`` (torch.compile, torch._lazy,
torch_xla) and ``jax/``.

mypy comes with the dev extra (``pip install -e '.[dev]'``); without it the
tests skip and say so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import ROOT

ENGINES = Path("metrics", "engines")
PARTS = {
    "shared": None,  # the modules directly in metrics/engines
    "torch": ENGINES / "torch",
    "jax": ENGINES / "jax",
}


def _part(path: str) -> str | None:
    p = Path(path)
    for name, folder in PARTS.items():
        if folder is not None and folder in p.parents:
            return name
    return "shared" if p.parent == ENGINES else None


@pytest.fixture(scope="module")
def errors() -> list[str]:
    """mypy's error lines for metrics/engines (paths relative to the repository)."""
    try:
        from mypy import api
    except ImportError:
        pytest.skip("mypy is not installed: `pip install -e '.[dev]'` (the dev extra lists it)")
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypy reads pyproject.toml and prints paths relative to here
    try:
        out, err, status = api.run(["--config-file", "pyproject.toml",
                                    "--follow-imports=silent", "--no-error-summary",
                                    str(ENGINES)])
    finally:
        os.chdir(cwd)
    assert status in (0, 1), f"mypy did not run: {err or out}"
    return [line for line in out.splitlines() if ": error:" in line]


@pytest.mark.slow
@pytest.mark.parametrize("part", sorted(PARTS))
def test_engines_are_typed(errors: list[str], part: str) -> None:
    mine = [e for e in errors if _part(e.split(":", 1)[0]) == part]
    assert not mine, f"mypy finds {len(mine)} errors in {part}:\n" + "\n".join(mine)


def test_every_error_belongs_to_a_part() -> None:
    assert _part("metrics/engines/base.py") == "shared"
    assert _part("metrics/engines/torch/compile/record.py") == "torch"
    assert _part("metrics/engines/jax/engine.py") == "jax"
    assert _part("metrics/recording/recorder.py") is None
