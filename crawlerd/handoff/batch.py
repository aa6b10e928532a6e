"""A hand-off batch on the wire and on disk: a checked header, then (fingerprint, aux) records.

Layout (little-endian): header ``magic u32, version u16, flags u16, source u32, count u32,
seq u64, body bytes u32, crc32 u32`` (crc32 of the body), then per record ``fp u64, aux bytes
u32, aux``. The same bytes serve every transport (a spool file, a network message).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

MAGIC = 0x46444E48          # "HNDF"
VERSION = 1
_HEAD = struct.Struct("<IHHIIQII")
_REC = struct.Struct("<QI")
HEADER_BYTES = _HEAD.size


class BatchError(ValueError):
    """Bytes that are not a whole, intact batch (torn or corrupt)."""


@dataclass(slots=True)
class Batch:
    """One batch from ``source``; ``seq`` orders a source's batches. ``ref``: the transport's handle
    for ``ack`` (a spool file path, a message)."""
    source: int
    seq: int
    records: list[tuple[int, bytes]]
    ref: object = None
    size: int = 0
    extra: dict = field(default_factory=dict)


def encode_batch(source: int, seq: int, records: list[tuple[int, bytes]]) -> bytes:
    parts = []
    for fp, aux in records:
        parts.append(_REC.pack(fp, len(aux)))
        parts.append(aux)
    body = b"".join(parts)
    return _HEAD.pack(MAGIC, VERSION, 0, source, len(records), seq, len(body), zlib.crc32(body)) + body


def decode_batch(data: bytes) -> Batch:
    if len(data) < HEADER_BYTES:
        raise BatchError(f"{len(data)} bytes: shorter than a batch header")
    magic, version, _flags, source, count, seq, nbody, crc = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise BatchError(f"not a hand-off batch (magic {magic:#x}, version {version})")
    body = memoryview(data)[HEADER_BYTES:]
    if len(body) != nbody or zlib.crc32(body) != crc:
        raise BatchError(f"batch {source}-{seq}: body torn or corrupt ({len(body)} of {nbody} bytes)")
    records = []
    pos = 0
    for _ in range(count):
        if pos + _REC.size > nbody:
            raise BatchError(f"batch {source}-{seq}: {count} records announced, body ends early")
        fp, n = _REC.unpack_from(body, pos)
        pos += _REC.size
        records.append((fp, bytes(body[pos:pos + n])))
        pos += n
    if pos != nbody:
        raise BatchError(f"batch {source}-{seq}: {nbody - pos} bytes after the last record")
    return Batch(source, seq, records, size=len(data))
