"""Generate the Python modules for wattpipe's .proto files (the kubelet pod-resources API).

    python scripts/gen_protos.py           # rewrite the generated files in the tree
    python scripts/gen_protos.py --check   # exit 1, naming each file that is stale or hand-edited

protoc runs from the repository root with ``-I .`` on ``wattpipe/pipeline/proto`` (the installed name of the
repository's ``pipeline/`` folder; see pyproject.toml), so ``pipeline/proto/x/v1/api.proto`` becomes the module
``wattpipe.pipeline.proto.x.v1.api_pb2`` and its ``_grpc`` module imports it by that full package path.
The output depends on the grpcio-tools version (it embeds the protobuf and grpcio versions it needs at
run time), which is why the dev extra pins grpcio-tools.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = Path("wattpipe") / "pipeline" / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(root: Path) -> list[Path]:
    """Every .proto under ``pipeline/proto``, relative to ``root``, in a stable order."""
    return sorted(path.relative_to(root) for path in (root / PROTO_DIR).rglob("*.proto"))


def generated_files(root: Path) -> list[Path]:
    """The generated modules present under ``pipeline/proto``, relative to ``root``."""
    found = (p for p in (root / PROTO_DIR).rglob("*") if p.is_file() and p.name.endswith(GENERATED_SUFFIXES))
    return sorted(path.relative_to(root) for path in found)


def generate(root: Path, out_dir: Path) -> list[Path]:
    """Run protoc on ``root``'s .proto files, writing under ``out_dir``; return the files written."""
    protos = proto_files(root)
    if not protos:
        raise SystemExit(f"no .proto files under {root / PROTO_DIR}")
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        ".",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(proto) for proto in protos),
    ]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"protoc failed ({result.returncode}):\n{result.stderr}")
    return generated_files(out_dir)


def check(root: Path) -> list[str]:
    """What differs between ``root``'s generated files and a fresh generation ([] when up to date)."""
    with tempfile.TemporaryDirectory(prefix="wattpipe-protos-") as tmp:
        fresh_dir = Path(tmp)
        fresh = set(generate(root, fresh_dir))
        present = set(generated_files(root))
        problems = [f"{path}: missing (not generated yet)" for path in sorted(fresh - present)]
        problems += [f"{path}: stale (no .proto generates it)" for path in sorted(present - fresh)]
        problems += [
            f"{path}: differs from a fresh generation"
            for path in sorted(fresh & present)
            if (fresh_dir / path).read_bytes() != (root / path).read_bytes()
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Generate the Python modules for the .proto files under pipeline/proto."
    )
    parser.add_argument("--check", action="store_true", help="only compare with a fresh generation; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(ROOT)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run: python scripts/gen_protos.py", file=sys.stderr)
        return 1 if problems else 0
    for path in generate(ROOT, ROOT):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
