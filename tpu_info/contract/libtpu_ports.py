"""libtpu's ports, and whether this host is one where libtpu may serve them.

libtpu serves its ``RuntimeMetricService`` on 8431 (:data:`LIBTPU_PORT`), or,
with several TPU processes on one host, on the ports listed in
``$TPU_RUNTIME_METRICS_PORTS`` (comma separated). Its service is the truth for
duty cycle and HBM, so the hook never takes one of those ports on a host
with TPU chips or with libtpu installed (:func:`tpu_host`), and the CLI reads
every one of them (:func:`libtpu_ports`). The hook imports this module:
it reads sysfs and asks the import system, and imports neither libtpu nor jax.

Example:
    >>> libtpu_ports({"TPU_RUNTIME_METRICS_PORTS": "8431,8432, 8433"})
    (8431, 8432, 8433)
    >>> libtpu_ports({"TPU_RUNTIME_METRICS_PORTS": ""})
    (8431,)
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

__all__ = ["LIBTPU_PORT", "ENV_PORTS", "TPU_PCI_DEVICES", "libtpu_ports", "has_tpu_chips",
           "libtpu_installed", "tpu_host"]

LIBTPU_PORT = 8431
ENV_PORTS = "TPU_RUNTIME_METRICS_PORTS"
GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of Google's TPU chips (v2/v3, v4, v5e, v5p, v6e, 7x), as
# tpu_info.host.devices.GENERATIONS lists them; Google's other functions
# (gVNIC, for one) are no TPU.
TPU_PCI_DEVICES = frozenset({"0x0027", "0x005e", "0x0063", "0x0062", "0x006f", "0x0076"})


def libtpu_ports(environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """8431 and the ports of ``$TPU_RUNTIME_METRICS_PORTS``, each once, in order;
    words that are not port numbers (1..65535) are left out."""
    env = os.environ if environ is None else environ
    out = [LIBTPU_PORT]
    for word in env.get(ENV_PORTS, "").split(","):
        word = word.strip()
        if word.isascii() and word.isdigit() and 0 < int(word) < 65536 \
                and int(word) not in out:
            out.append(int(word))
    return tuple(out)


def has_tpu_chips(sysfs_root: str = "/sys") -> bool:
    """Whether a TPU chip is on this host's PCI bus (Google's vendor id and a
    TPU's device id under ``<sysfs_root>/bus/pci/devices``). Never raises."""
    root = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        functions = os.listdir(root)
    except OSError:
        return False
    for name in functions:
        try:
            with open(os.path.join(root, name, "vendor"), encoding="ascii") as f:
                if f.read().strip().lower() != GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(root, name, "device"), encoding="ascii") as f:
                if f.read().strip().lower() in TPU_PCI_DEVICES:
                    return True
        except (OSError, ValueError):
            continue
    return False


def libtpu_installed() -> bool:
    """Whether ``import libtpu`` would find it (asked of the import system, not imported)."""
    try:
        return importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        return False


def tpu_host(sysfs_root: str = "/sys") -> bool:
    """A host where libtpu may serve its ports: TPU chips on its bus, or libtpu installed."""
    return has_tpu_chips(sysfs_root) or libtpu_installed()
