"""``tpu-info -v``: Google's three lines, so scripts that parse them keep working.

::

    - tpu-info version: 0.1.0
    - libtpu version: 0.0.21
    - accelerator type: v5e

Where libtpu or a TPU is missing, the value is ``unknown (why)``, as Google's
tool prints it. The libtpu version comes from the installed package's
metadata (libtpu is never imported: that would take the TPU); the
accelerator type from the local sysfs scan. ``--json`` prints the same as
an object.

Example:
    >>> from tpu_info.contract.model import LocalScan
    >>> accelerator_type(LocalScan(reasons={"tpu": "no TPU chips found (no PCI device)"}))
    'unknown (no TPU chips found)'
"""

from __future__ import annotations

import json
from importlib import metadata

from tpu_info import __version__
from tpu_info.contract.model import LocalScan
from tpu_info.contract.safe import clean

LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")


def libtpu_version() -> str:
    """The installed libtpu's version, or ``unknown (libtpu not found)``."""
    for name in LIBTPU_DISTRIBUTIONS:
        try:
            return clean(metadata.version(name), 80)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return "unknown (libtpu not found)"


def accelerator_type(scan: LocalScan) -> str:
    """The local TPU generation(s) (``v5e``), or ``unknown (why)``."""
    kinds = sorted({c.kind for c in scan.tpus})
    if kinds:
        return ", ".join(kinds)
    why = clean(scan.reasons.get("tpu") or "", 200)
    return f"unknown ({'no TPU chips found' if why.startswith('no TPU chips') or not why else why})"


def version_info(scan: LocalScan) -> dict[str, str]:
    return {"tpu_info_version": __version__, "libtpu_version": libtpu_version(),
            "accelerator_type": accelerator_type(scan)}


def version_text(scan: LocalScan, as_json: bool = False) -> str:
    """Google's three lines (or their JSON object), newline-terminated."""
    info = version_info(scan)
    if as_json:
        return json.dumps(info) + "\n"
    return (f"- tpu-info version: {info['tpu_info_version']}\n"
            f"- libtpu version: {info['libtpu_version']}\n"
            f"- accelerator type: {info['accelerator_type']}\n")
