"""TEI's gRPC messages (tei.proto), built from its compiled descriptor into a pool of our own.

No generated `_pb2` module: generated code pins the protobuf runtime to the generator's major version, and a
client's own `tei_pb2` in the same process (TEI's Python clients generate one) would clash with ours in the
default pool. The descriptor set (`tei.binpb`) is what protoc compiles from `tei.proto`; `python -m
encoderrt.proto` writes it again after the proto changes, and a test holds the two together.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HERE = Path(__file__).parent
PROTO = HERE / "tei.proto"
DESCRIPTORS = HERE / "tei.binpb"
PACKAGE = "tei.v1"

pool = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes()).file:
    pool.Add(_file)
file = pool.FindFileByName("tei.proto")


@functools.cache
def message(name: str) -> Any:
    """The message class of tei.v1.`name` (looked up once: handlers ask for it on every call)."""
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
