"""The end's save is the run's file: a checkpoint still encoding when the
program ends never replaces it (a loaded machine once let one land after the
end's save, and a normal end read "ended without its exit work")."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from metrics.export import saving
from tpu_info.contract.model import Snapshot
from tpu_info.wire import runfile


def test_a_checkpoint_still_encoding_at_the_end_never_replaces_the_ends_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    encoding, release = threading.Event(), threading.Event()
    real_encode = runfile.encode

    def encode(data: bytes, ended: str, *args, **kwargs) -> bytes:
        if not ended:  # the checkpoint: held mid-encode until the end's save is written
            encoding.set()
            release.wait(10)
        return real_encode(data, ended, *args, **kwargs)

    monkeypatch.setattr(saving.runfile, "encode", encode)
    monkeypatch.setattr(saving, "FIRST_CHECKPOINT_S", 0.01)
    path = tmp_path / "run.tpurun"
    saver = saving.RunSaver(lambda: Snapshot(1.0), (path, False),
                            failed=lambda where, e: (_ for _ in ()).throw(e))
    checkpoints = threading.Thread(target=saver.checkpoints, daemon=True)
    checkpoints.start()
    assert encoding.wait(10)
    assert saver.save() == path  # the end, while the checkpoint encodes
    release.set()
    checkpoints.join(10)
    assert not checkpoints.is_alive()
    assert runfile.read(path).ended == "exit"


def test_a_run_with_nothing_new_is_still_checkpointed_every_still_period(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long compile or a stalled pipeline adds no event, step or graph: the
    checkpoint is rewritten anyway every STILL_S, so a program killed then
    leaves how long it was there (the file stayed at the last change)."""
    monkeypatch.setattr(saving, "FIRST_CHECKPOINT_S", 0.01)
    monkeypatch.setattr(saving, "CHECKPOINT_S", 0.02)
    monkeypatch.setattr(saving, "STILL_S", 0.05)
    clock = iter(range(1, 10_000))
    path = tmp_path / "run.tpurun"
    saver = saving.RunSaver(lambda: Snapshot(1.0, uptime_seconds=float(next(clock))), (path, False),
                            failed=lambda where, e: (_ for _ in ()).throw(e))
    checkpoints = threading.Thread(target=saver.checkpoints, daemon=True)
    checkpoints.start()
    seen: set[float] = set()
    for _ in range(400):
        if path.exists():
            try:
                seen.add(runfile.read(path).snapshot.uptime_seconds)
            except runfile.RunFileError:
                pass
        if len(seen) >= 3:
            break
        threading.Event().wait(0.01)
    saver.save()
    checkpoints.join(10)
    assert len(seen) >= 3, f"checkpoints with the same key were not rewritten: {seen}"
