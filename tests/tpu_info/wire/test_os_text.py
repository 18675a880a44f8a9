"""Text the OS gave with bytes that are not UTF-8 (lone surrogates, as Python
decodes them) on the wire: :func:`tpu_info.contract.safe.os_text` and the
encoder's fallback (``retexted``) for strings from anywhere in a snapshot
(an engine's source path in a Latin-1 directory)."""

from __future__ import annotations

from tpu_info.contract.model import Event, ProcessRecord, Snapshot
from tpu_info.contract.safe import os_text
from tpu_info.proto import tpu_info_v1_pb2 as pb
from tpu_info.wire.encoder import PartCache, retexted, snapshot_to_bytes


def test_os_text_escapes_each_byte_that_is_not_utf8():
    assert os_text("/data/caf\udce9.txt") == "/data/caf\\xe9.txt"
    assert os_text("\ud800") == "\\ud800"  # a lone surrogate that was no byte
    plain = "train.py é"
    assert os_text(plain) is plain


def test_a_snapshot_with_surrogates_anywhere_encodes_valid_text():
    process = ProcessRecord(7, "t.py", argv=("t.py", "caf\udce9"))
    ok = Event(1, 1.0, "compile", name="f")
    bad = Event(2, 1.0, "compile", name="g", location="/src/d\udce9/t.py:3")
    s = Snapshot(1.0, process, events=(ok, bad))
    for cache in (None, PartCache()):
        msg = pb.Snapshot.FromString(snapshot_to_bytes(s, cache))
        assert list(msg.process.argv) == ["t.py", "caf\\xe9"]
        assert msg.events[1].location == "/src/d\\xe9/t.py:3"
    fixed = retexted(s)
    assert fixed.events[0] is ok and fixed.events[1] is not bad  # the rest kept as it is
    assert retexted(fixed) is fixed
