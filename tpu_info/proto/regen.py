"""Regenerates the ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` files.

Run from anywhere; protoc runs in the repository root with ``-I .`` so the
generated modules import each other as ``tpu_info.proto.<name>_pb2``::

    python -m tpu_info.proto.regen            # rewrite the checked-in files
    python -m tpu_info.proto.regen --out DIR  # write DIR/tpu_info/proto/...

Needs ``grpcio-tools`` (a dev dependency).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTOS: tuple[str, ...] = (
    "tpu_info/proto/tpu_telemetry.proto",
    "tpu_info/proto/tpu_metric_service.proto",
    "tpu_info/proto/tpu_info_v1.proto",
    "tpu_info/proto/kubelet_podresources.proto",
)


def generated_names() -> list[str]:
    """File names (inside ``tpu_info/proto``) the generator writes."""
    out = []
    for proto in PROTOS:
        stem = Path(proto).stem
        out += [f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"]
    return out


def regenerate(out_root: Path = REPO_ROOT) -> list[Path]:
    """Runs protoc; returns the files written under ``out_root/tpu_info/proto``.

    Raises:
        RuntimeError: protoc failed (its stderr is in the message).
    """
    well_known = resources.files("grpc_tools") / "_proto"
    out_root = Path(out_root)
    (out_root / "tpu_info" / "proto").mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc",
        "-I", ".", "-I", str(well_known),
        f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}",
        *PROTOS,
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"protoc failed ({proc.returncode}): {proc.stderr.strip()}")
    return [out_root / "tpu_info" / "proto" / name for name in generated_names()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT,
                        help="root to write tpu_info/proto/* under (default: the repository)")
    args = parser.parse_args(argv)
    for path in regenerate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
