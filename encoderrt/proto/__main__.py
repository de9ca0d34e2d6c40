"""Compile tei.proto into tei.binpb (needs grpcio-tools, a test dependency): python -m encoderrt.proto."""

from __future__ import annotations

import sys

from encoderrt.proto import DESCRIPTORS, PROTO


def compile_descriptors(out: str) -> None:
    from grpc_tools import protoc

    if protoc.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={out}", PROTO.name]) != 0:
        raise SystemExit(f"protoc could not compile {PROTO}")


if __name__ == "__main__":
    compile_descriptors(sys.argv[1] if len(sys.argv) > 1 else str(DESCRIPTORS))
