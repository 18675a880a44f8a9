"""Device-level traces for a capture window: ``jax.profiler`` and ``torch.profiler``.

Only engines the program has already imported are profiled (this module
never imports jax or torch on its own); which profiler covers which engine
is :mod:`metrics.engines.registry`'s ``device_profiler``. Each profiler writes into its own
folder under the capture's output folder; :meth:`DeviceTraces.stop` returns
the files written, and every failure becomes a note instead of an error, so
the host-side trace is never lost to a device profiler's trouble.

Example:
    >>> from pathlib import Path
    >>> traces = DeviceTraces(Path("/tmp/run_device"), modules={})  # no engine imported
    >>> traces.start()
    >>> traces.stop(), traces.notes
    ([], ['device trace: no engine imported (jax or torch)'])
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metrics.engines import registry

__all__ = ["DeviceTraces"]


class DeviceTraces:
    """Starts and stops the device profilers of the imported engines.

    Args:
        out_dir: folder the profilers write under (``jax/``, ``torch/``).
        modules: where to look for imported engines (default ``sys.modules``).
    """

    def __init__(self, out_dir: Path, modules: Mapping[str, Any] | None = None) -> None:
        self.out_dir = Path(out_dir)
        self._modules = sys.modules if modules is None else modules
        self.notes: list[str] = []
        self._jax: Any = None
        self._torch: Any = None

    def start(self) -> None:
        """Starts what can be started; failures become :attr:`notes`."""
        libraries = registry.device_profilers()
        present = [lib for lib in libraries if lib in self._modules]
        if not present:
            self.notes.append(f"device trace: no engine imported ({' or '.join(libraries)})")
            return
        for lib in present:
            starter = getattr(self, f"_start_{lib}", None)
            if starter is None:
                self.notes.append(f"device trace: no device profiler for {lib} here")
                continue
            starter()

    def _start_jax(self) -> None:
        try:
            import jax.profiler

            path = self.out_dir / "jax"
            path.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(path))
            self._jax = jax.profiler
        except Exception as e:  # noqa: BLE001 - the host trace goes on without it
            self.notes.append(f"device trace: jax.profiler did not start: {e}")

    def _start_torch(self) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            prof = profile(activities=activities)
            prof.__enter__()
            self._torch = prof
            self.notes.append("device trace: torch.profiler records the operators of "
                              "the thread that started it (the capture's thread) and the "
                              "device kernels; operators on the program's threads may "
                              "be missing")
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"device trace: torch.profiler did not start: {e}")

    def stop(self) -> list[Path]:
        """Stops the profilers; returns every file they wrote, sorted."""
        files: list[Path] = []
        if self._jax is not None:
            try:
                self._jax.stop_trace()
                files += sorted(p for p in (self.out_dir / "jax").rglob("*") if p.is_file())
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"device trace: jax.profiler did not stop cleanly: {e}")
            self._jax = None
        if self._torch is not None:
            try:
                self._torch.__exit__(None, None, None)
                path = self.out_dir / "torch" / "trace.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                self._torch.export_chrome_trace(str(path))
                files.append(path)
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"device trace: torch.profiler did not stop cleanly: {e}")
            self._torch = None
        return files
