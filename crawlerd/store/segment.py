"""Reading WARC segments member by member, without trusting them.

A segment is a sequence of gzip members, one WARC record each (WARC/1.1
annex D.2). :func:`iter_members` walks the members from the start and stops
at the first byte that is not a complete member, so the same walk serves
recovery (where to cut a torn tail), indexing and verification.

Also here: the small HTTP-head helpers the writer and the indexer share
(status line, header lookup, RFC 9112 §7.1 chunked decoding).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

READ_CHUNK_BYTES = 1 << 20
# Decompressed bytes kept per member for header parsing: WARC head + HTTP head.
# HTTP heads above fetch.max_header_bytes (64 KiB default) are refused upstream.
HEAD_KEEP_BYTES = 192 << 10
CRLF2 = b"\r\n\r\n"


@dataclass(slots=True)
class Member:
    """One complete gzip member of a segment.

    ``offset``/``length`` are compressed bytes in the file; ``head`` is the
    first HEAD_KEEP_BYTES of its decompressed content (all of it when
    ``keep_all``); ``size`` counts all decompressed bytes; ``tail`` is the
    last 4 decompressed bytes (a record ends with CRLF CRLF).
    """

    offset: int
    length: int
    head: bytes
    size: int
    tail: bytes


@dataclass(slots=True)
class WarcHead:
    """The parsed header block of one record; ``block_offset`` is where its block starts in
    the decompressed member."""

    version: str
    fields: list[tuple[str, str]]
    block_offset: int

    def get(self, name: str, default: str | None = None) -> str | None:
        lname = name.lower()
        for k, v in self.fields:
            if k.lower() == lname:
                return v
        return default

    @property
    def type(self) -> str:
        return self.get("WARC-Type", "") or ""

    @property
    def content_length(self) -> int:
        return int(self.get("Content-Length", "-1") or "-1")


class BadRecord(ValueError):
    """A member whose content is not a well-formed WARC record."""


def iter_members(f, *, keep_all: bool = False) -> Iterator[Member]:
    """Yield the complete gzip members of ``f`` from its current position.

    Stops quietly at end of file, at a torn (incomplete) member, or at bytes
    that are not gzip; ``end_offset(f)`` after the walk is not meaningful, use
    the last member's offset + length.
    """
    offset = f.tell()
    pending = b""
    while True:
        d = zlib.decompressobj(31)
        consumed = 0                      # compressed bytes of this member fed so far
        head = bytearray()
        size = 0
        tail = b""
        while not d.eof:
            if not pending:
                pending = f.read(READ_CHUNK_BYTES)
                if not pending:
                    return                # clean end (consumed == 0) or torn member
            try:
                out = d.decompress(pending)
            except zlib.error:
                return                    # garbage: not a gzip member
            if d.eof:
                used = len(pending) - len(d.unused_data)
                pending = d.unused_data
            else:
                used = len(pending)
                pending = b""
            consumed += used
            if out:
                size += len(out)
                if keep_all or len(head) < HEAD_KEEP_BYTES:
                    head += out if keep_all else out[:HEAD_KEEP_BYTES - len(head)]
                tail = (tail + out[-4:])[-4:]
        yield Member(offset, consumed, bytes(head), size, tail)
        offset += consumed


def parse_warc_head(data: bytes) -> WarcHead:
    """Parse the WARC version line and named fields at the start of ``data``."""
    end = data.find(CRLF2)
    if end < 0:
        raise BadRecord("no end of WARC header block")
    lines = data[:end].decode("utf-8", "replace").split("\r\n")
    version = lines[0]
    if not version.startswith("WARC/1."):
        raise BadRecord(f"bad version line {version[:40]!r}")
    fields = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRecord(f"bad WARC header line {line[:60]!r}")
        fields.append((name, value.strip()))
    return WarcHead(version, fields, end + 4)


def check_member(member: Member) -> WarcHead:
    """Parse a member as one whole record: header, Content-Length and the CRLF CRLF trailer."""
    head = parse_warc_head(member.head)
    length = head.content_length
    if length < 0:
        raise BadRecord("missing Content-Length")
    if head.block_offset + length + 4 != member.size:
        raise BadRecord(f"Content-Length {length} does not match the member "
                        f"({member.size - head.block_offset - 4} block bytes)")
    if member.tail != CRLF2:
        raise BadRecord("record does not end with CRLF CRLF")
    return head


# -- HTTP heads -------------------------------------------------------------

def http_status(head: bytes) -> int:
    """Status code from a response head's status line, 0 when there is none."""
    line = head.split(b"\n", 1)[0]
    parts = line.split(None, 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return 0


def http_header(head: bytes, name: bytes) -> bytes | None:
    """First value of header ``name`` (lower-case bytes) in an HTTP head, or None."""
    for line in head.split(b"\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


def is_chunked(head: bytes) -> bool:
    """True when the last transfer coding is chunked (RFC 9112 §6.1)."""
    if b"chunked" not in head.lower():
        return False
    te = http_header(head, b"transfer-encoding")
    return te is not None and te.lower().split(b",")[-1].strip() == b"chunked"


def dechunk(body: bytes) -> bytes:
    """Remove chunked transfer coding (RFC 9112 §7.1); chunk extensions and trailers are dropped.

    Lenient like a browser: bare LF line ends are accepted, and a torn or
    malformed tail ends the body with what was decoded before it.
    """
    out = []
    pos = 0
    n = len(body)
    while pos < n:
        eol = body.find(b"\n", pos)
        if eol < 0:
            break
        size_field = body[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_field, 16)
        except ValueError:
            break
        if size == 0:
            break
        start = eol + 1
        out.append(body[start:start + size])
        pos = start + size
        if body.startswith(b"\r\n", pos):
            pos += 2
        elif body.startswith(b"\n", pos):
            pos += 1
        elif pos < n:
            break
    return b"".join(out)


def http_split(block: bytes) -> tuple[bytes, bytes]:
    """Split an HTTP message into (head incl. the blank line, body)."""
    end = block.find(CRLF2)
    if end >= 0:
        return block[:end + 4], block[end + 4:]
    end = block.find(b"\n\n")
    if end >= 0:
        return block[:end + 2], block[end + 2:]
    return block, b""


OPEN_SUFFIX = ".open"


def create_next(directory: str, name_for: Callable[[int], str], serial: int) -> tuple[BinaryIO, str, int]:
    """Create the first unused ``<name>.open`` (exclusively, so two writers never share a file)
    for serial numbers from ``serial`` on. Returns (unbuffered file, final path, next serial)."""
    while True:
        path = os.path.join(directory, name_for(serial))
        serial += 1
        if os.path.exists(path):
            continue
        try:
            return open(path + OPEN_SUFFIX, "xb", buffering=0), path, serial
        except FileExistsError:
            continue
