"""The engines' device profilers, behind :class:`metrics.engines.base.DeviceTrace`.

An adapter names its profiler (``device_trace_kind``); a device capture,
remote (``tpu-info profile --device``, run by the hook whether or not the
program loaded ``profiler``) or local (``profiler.trace(device=True)``),
runs every installed engine's profiler once per library through
:class:`DeviceWindow`. Each profiler writes into its own folder under the
capture's, and every failure becomes a note instead of an error, so the
host-side trace is never lost to a device profiler's trouble. The engine's
library is imported only when a capture starts (the adapter has imported
it already).

Example:
    >>> from pathlib import Path
    >>> window = DeviceWindow([], Path("/tmp/run_device"))  # no engine installed
    >>> window.start()
    >>> window.stop(), window.notes
    ([], ['device trace: no engine hook is installed (metrics.install())'])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from metrics.engines.base import DeviceTrace, Engine

if TYPE_CHECKING:
    import torch.profiler

__all__ = ["JaxTrace", "TorchTrace", "DeviceWindow"]


class JaxTrace:
    """``jax.profiler.start_trace`` / ``stop_trace`` (XPlane files)."""

    library = "jax"

    def __init__(self) -> None:
        self._folder: Path | None = None

    def start(self, folder: Path) -> None:
        import jax.profiler

        folder.mkdir(parents=True, exist_ok=True)
        jax.profiler.start_trace(str(folder))
        self._folder = folder

    def stop(self) -> tuple[list[Path], list[str]]:
        import jax.profiler

        folder, self._folder = self._folder, None
        if folder is None:
            return [], []
        jax.profiler.stop_trace()
        return sorted(p for p in folder.rglob("*") if p.is_file()), []


class TorchTrace:
    """``torch.profiler.profile`` over CPU (and CUDA when present), exported
    as a Chrome trace."""

    library = "torch"

    def __init__(self) -> None:
        self._prof: torch.profiler.profile | None = None
        self._folder: Path | None = None

    def start(self, folder: Path) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities)
        prof.__enter__()
        self._prof, self._folder = prof, folder

    def stop(self) -> tuple[list[Path], list[str]]:
        prof, folder = self._prof, self._folder
        self._prof = self._folder = None
        if prof is None or folder is None:
            return [], []
        prof.__exit__(None, None, None)
        path = folder / "trace.json"
        folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        return [path], ["device trace: torch.profiler records the operators of the thread "
                        "that started it (the capture's thread) and the device kernels; "
                        "operators on the program's threads may be missing"]


class DeviceWindow:
    """Starts and stops the device profilers of the installed engines, one
    per library (torch_compile, torch_lazy and torch_xla share torch's).

    Args:
        engines: the installed engine adapters.
        out_dir: the folder the profilers write under (``jax/``, ``torch/``).
    """

    def __init__(self, engines: Sequence[Engine], out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.notes: list[str] = []
        self._engines = list(engines)
        self._running: list[DeviceTrace] = []

    def start(self) -> None:
        """Starts what can be started; failures become :attr:`notes`."""
        if not self._engines:
            self.notes.append("device trace: no engine hook is installed (metrics.install())")
            return
        libraries: set[str] = set()
        for engine in self._engines:
            trace = engine.device_trace()
            if trace is None:
                self.notes.append(f"device trace: the {engine.name} engine has no device "
                                  "profiler here")
                continue
            if trace.library in libraries:
                continue
            libraries.add(trace.library)
            try:
                trace.start(self.out_dir / trace.library)
                self._running.append(trace)
            except Exception as e:  # noqa: BLE001 - the host trace goes on without it
                self.notes.append(f"device trace: {trace.library}.profiler did not start: {e}")

    def stop(self) -> list[Path]:
        """Stops the profilers; returns every file they wrote."""
        files: list[Path] = []
        running, self._running = self._running, []
        for trace in running:
            try:
                written, notes = trace.stop()
                files += written
                self.notes += notes
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"device trace: {trace.library}.profiler did not stop "
                                  f"cleanly: {e}")
        return files
