"""Shared fixtures. Tests run real JAX on the CPU; nothing is mocked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = ROOT / "tests" / "system"
TPU_LANE = ROOT / "tests" / "tpu"
# What the user asked JAX for, before the CPU default below: the TPU lane's
# programs take the chip unless the user forced the CPU.
USER_JAX_PLATFORMS = os.environ.get("JAX_PLATFORMS")

# Several CPU devices for multi-device tests; must be set before jax imports.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Hooked programs started by tests (and this process) never take 8431 from a
# real libtpu or a neighbour; the one test about 8431 removes this.
os.environ.setdefault("TPU_INFO_PORT", "0")
# Hooked test programs save no run unless a test asks (tests/system/test_saved_runs.py):
# many tests check that a program leaves its runtime directory empty.
os.environ.setdefault("TPU_INFO_SAVE", "off")
# A suite started in the background (``nohup``, ``cmd &`` in a script) inherits
# SIGINT ignored, and so would every program a test starts: Python installs no
# KeyboardInterrupt in them, and the tests that press Ctrl-C (test_exit, the
# CLI's --streaming, the TUI) would wait out a Ctrl-C that can never land. A
# handled signal is reset to the default in an exec'd child; an ignored one is not.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def patient(seconds: float) -> float:
    """A hang guard's timeout stretched by the machine's load: a heavy program
    (torch.compile, torch_xla) takes about load/cores times longer on a loaded
    machine (``tools/loaded_suite.py``). Never a performance check."""
    cores = os.cpu_count() or 1
    return seconds * max(1.0, os.getloadavg()[0] / cores)


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter with the project importable."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


@pytest.fixture
def rdir(tmp_path: Path) -> Path:
    """A private (0700) runtime directory for discovery records."""
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    return d


@pytest.fixture
def fresh_metrics():
    """The global recorder, emptied before and after the test, hooks installed."""
    import metrics

    rec = metrics.install(engines=["jax"], serve=False)
    rec.reset()
    yield rec
    rec.reset()


# `make test-fast` (``--fast``): unit tests only. Left out: every test under
# tests/system (whole programs, faults) and every test marked ``slow``. A test
# it keeps that starts a process (a hooked program, the torch_xla venv,
# Prometheus, a browser, tmux, a compiler) fails, saying to mark it slow.
_SPAWNS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty",
                     "os.system", "os.exec"})
_running: list[str] = []
_spawned: dict[str, list[str]] = {}


def _record_spawn(event: str, args: tuple) -> None:
    if _running and event in _SPAWNS:
        _spawned.setdefault(_running[-1], []).append(f"{event} {args[:2]!r}"[:200])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", default=False,
                     help="unit tests only (make test-fast): no tests/system, no test marked "
                          "slow, and a kept test that starts a process fails")
    parser.addoption("--tpu", action="store_true", default=False,
                     help="run the tests marked tpu even where no TPU chip is found "
                          "(also TPU_INFO_TEST_TPU=1; TPU_INFO_TEST_TPU=0 skips them)")


def tpu_chip(sys_root: str = "/sys", dev_root: str = "/dev") -> str | None:
    """A usable Google TPU chip here: the first PCI function of vendor 0x1ae0
    whose device node exists (``/dev/vfio/<iommu group>`` from v5e on,
    ``/dev/accelN`` before), as ``pci-address (node)``; else None. A sandbox
    can show more functions than it lets a program open (the TPU machine: 4
    functions, one ``/dev/vfio/1``)."""
    pci = Path(sys_root) / "bus/pci/devices"
    try:
        functions = sorted(pci.iterdir())
    except OSError:
        return None
    accel = sorted(Path(dev_root).glob("accel*"))
    for fn in functions:
        try:
            if (fn / "vendor").read_text().strip().lower() != "0x1ae0":
                continue
            group = os.path.basename(os.readlink(fn / "iommu_group"))
        except OSError:
            group = ""
        node = Path(dev_root) / "vfio" / group if group else None
        if node is not None and node.exists():
            return f"{fn.name} ({node})"
        if accel:
            return f"{fn.name} ({accel[0]})"
    return None


def tpu_lane_enabled(config: pytest.Config) -> tuple[bool, str]:
    """Whether the tests marked ``tpu`` run here, and why not when they don't."""
    asked = os.environ.get("TPU_INFO_TEST_TPU", "")
    if config.getoption("tpu") or asked == "1":
        return True, ""
    if asked == "0":
        return False, "TPU_INFO_TEST_TPU=0"
    if (USER_JAX_PLATFORMS or "").strip().lower() == "cpu":
        return False, "JAX_PLATFORMS=cpu forces the CPU"
    if tpu_chip() is None:
        return False, ("needs a TPU chip (no PCI function of vendor 0x1ae0 with its /dev node): "
                       "make test-tpu on a TPU machine, or --tpu / TPU_INFO_TEST_TPU=1")
    return True, ""


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("fast"):
        sys.addaudithook(_record_spawn)  # audit hooks cannot be removed: --fast runs only


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tpu_ok, why_not = None, ""
    rerun = config.pluginmanager.hasplugin("rerunfailures")
    for item in items:
        if SYSTEM in item.path.parents or TPU_LANE in item.path.parents:
            item.add_marker(pytest.mark.slow)
        if rerun and item.get_closest_marker("slow") is not None \
                and item.get_closest_marker("flaky") is None:
            # A real program's shares on a shared 2-core machine: one more try
            # before a failure counts (a rerun is listed in the summary, "R").
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=1))
        if item.get_closest_marker("tpu") is not None:
            if tpu_ok is None:
                tpu_ok, why_not = tpu_lane_enabled(config)
            if not tpu_ok:
                item.add_marker(pytest.mark.skip(reason=why_not))
    if config.getoption("fast"):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _running.append(item.nodeid)
    try:
        yield
    finally:
        _running.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    spawns = _spawned.pop(item.nodeid, None)
    if spawns and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = (f"make test-fast runs unit tests only, and this test starts a process "
                           f"in its {call.when}: mark it @pytest.mark.slow\n  " + "\n  ".join(spawns))
