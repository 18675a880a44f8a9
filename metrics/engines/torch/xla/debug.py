"""Reads torch_xla's ``PT_XLA_DEBUG_LEVEL`` compilation analyses from its file.

With ``PT_XLA_DEBUG_LEVEL=1`` torch_xla writes one "Compilation Analysis"
block per compile (cause, graph hash, inputs, outputs, the Python frames that
triggered it) to ``PT_XLA_DEBUG_FILE``, or to stderr when that is unset.
:class:`DebugTail` reads the new complete blocks from the file at scrape
time; nothing happens on the program's hot path. Pure Python: no torch.

Example::

    tail = DebugTail(os.environ["PT_XLA_DEBUG_FILE"])
    for analysis in tail.read():   # at scrape time
        print(analysis.graph_hash, analysis.cause)
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

_PREFIX = "Compilation Analysis: "
_RULE = re.compile(r"^=+$")
_FRAME = re.compile(r"^(?P<func>\S.*?) \((?P<file>.+):(?P<line>\d+)\)$")


@dataclass(frozen=True, slots=True)
class CompileAnalysis:
    """One compilation torch_xla explained."""

    cause: str
    graph_hash: str
    inputs: int | None
    outputs: int | None
    frames: tuple[tuple[str, str, int], ...]  # (function, file, line), innermost first

    def user_frame(self, skip: tuple[str, ...]) -> tuple[str, str, int] | None:
        """The innermost frame whose file is not under ``skip``."""
        for f in self.frames:
            if not f[1].startswith(skip) and not f[1].endswith("typing_extensions.py"):
                return f
        return None


def _block(lines: list[str]) -> CompileAnalysis | None:
    section = ""
    cause: list[str] = []
    frames: list[tuple[str, str, int]] = []
    graph_hash = ""
    inputs = outputs = None
    for raw in lines:
        body = raw.rstrip()
        stripped = body.strip()
        if not stripped or _RULE.match(stripped) or set(stripped) == {"-"}:
            continue
        if not body.startswith("  "):
            section = stripped.rstrip(":")
            continue
        if section == "Compilation Cause":
            cause.append(stripped)
        elif section == "Graph Info":
            key, _, value = stripped.partition(":")
            value = value.strip()
            if key == "Graph Hash":
                graph_hash = value
            elif key == "Number of Graph Inputs" and value.isdigit():
                inputs = int(value)
            elif key == "Number of Graph Outputs" and value.isdigit():
                outputs = int(value)
        elif section.startswith("Python Frame"):
            m = _FRAME.match(stripped)
            if m:
                frames.append((m.group("func"), m.group("file"), int(m.group("line"))))
    if not graph_hash and not cause:
        return None
    return CompileAnalysis(" ".join(cause), graph_hash, inputs, outputs, tuple(frames))


def parse(text: str) -> tuple[list[CompileAnalysis], int]:
    """Complete blocks in ``text`` and how many characters they used up
    (a trailing partial block is left for the next read)."""
    out: list[CompileAnalysis] = []
    consumed = 0
    pos = 0
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        pos += len(line)
        if not line.endswith("\n"):
            break  # a line still being written
        if not line.startswith(_PREFIX):
            if current is None:
                consumed = pos
            continue
        body = line[len(_PREFIX):].rstrip("\n")
        if current is None:
            if _RULE.match(body.strip()):
                current = []
            continue
        if _RULE.match(body.strip()):
            block = _block(current)
            if block is not None:
                out.append(block)
            current = None
            consumed = pos
            continue
        current.append(body)
    return out, consumed


class DebugTail:
    """Follows one debug file; :meth:`read` returns the blocks added since."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._lock = threading.Lock()

    def read(self) -> list[CompileAnalysis]:
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except OSError:
                return []
            if not data:
                return []
            text = data.decode("utf-8", errors="replace")
            blocks, used = parse(text)
            self._offset += len(text[:used].encode("utf-8", errors="replace"))
            return blocks

    def remove(self) -> None:
        try:
            os.unlink(self.path)
            os.rmdir(os.path.dirname(self.path))
        except OSError:
            pass
