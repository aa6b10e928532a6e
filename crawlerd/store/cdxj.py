"""CDXJ index lines: ``SURT TIMESTAMP14 {json}``, one per captured response, revisit or resource.

The lines are the ones cdxj-indexer (the indexer of pywb) writes for the same
segment, key for key and field for field, so pywb, OutbackCDX and our own
tools read either: the :func:`~crawlerd.store.surt.surt` key, the 14-digit UTC
capture time, then JSON (``json.dumps`` spacing, ASCII) with, in this order,

``url``       WARC-Target-URI
``mime``      ``warc/revisit`` for a revisit; else the HTTP Content-Type up to its first
              ``;`` or white space, case kept (absent when the response has none)
``status``    the HTTP status of a response or revisit that has an HTTP head
``digest``    WARC-Payload-Digest as written (``sha1:BASE32``)
``length``, ``offset``   the compressed bytes of the record's gzip member
``filename``  the segment's file name

Indexed: ``response``, ``revisit``, ``resource`` and ``metadata`` records, except
``resource``/``metadata`` whose Content-Type is ``application/warc-fields`` (our
per-capture metadata). A file of lines is sorted bytewise with duplicates
removed (``linesort``), so a binary search by key works.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str  # a JSON string literal, ASCII-only

from crawlerd.store import linesort
from crawlerd.store.segment import (
    BadRecord,
    check_member,
    http_header,
    http_split,
    iter_members,
)
from crawlerd.store.surt import surt

__all__ = ["Capture", "INDEXED_TYPES", "cdxj_path", "index", "iter_lines", "mime_of", "surt",
           "timestamp14", "write_index"]

INDEXED_TYPES = frozenset({"response", "revisit", "resource", "metadata"})
_FIELDS_TYPE = "application/warc-fields"
_MIME_END = re.compile(r"[;\s]")


def timestamp14(warc_date: str) -> str:
    """``2024-05-06T07:08:09.123456Z`` -> ``20240506070809``."""
    d = warc_date
    if len(d) >= 19 and d[4] == "-" and d[7] == "-" and d[10] == "T" and d[13] == ":" and d[16] == ":":
        stamp = d[0:4] + d[5:7] + d[8:10] + d[11:13] + d[14:16] + d[17:19]
        if stamp.isdigit() and stamp.isascii():
            return stamp        # the form WarcWriter writes: the same digits, picked out directly
    digits = "".join(c for c in warc_date[:19] if c.isdigit())
    return digits.ljust(14, "0")[:14]


def mime_of(content_type: bytes | str | None) -> str | None:
    """The CDXJ ``mime`` of a Content-Type value: up to the first ``;`` or white space, case kept;
    None when there is no header (the field is then left out)."""
    if content_type is None:
        return None
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    content_type = content_type.strip()
    return _MIME_END.split(content_type, 1)[0].strip() if content_type else content_type


@dataclass(slots=True)
class Capture:
    """What one CDXJ line says about one record; ``None`` fields are left out of the line."""

    url: str
    warc_date: str
    mime: str | None
    status: str | None
    digest: str | None
    length: int
    offset: int
    filename: str

    def line(self) -> str:
        """``SURT TIMESTAMP14 {json}``; the JSON is byte for byte what ``json.dumps(fields)`` gives
        (a test holds it to that), assembled from escaped strings without building a dict."""
        q = _json_str
        mime = f', "mime": {q(self.mime)}' if self.mime is not None else ""
        status = f', "status": {q(self.status)}' if self.status is not None else ""
        digest = f', "digest": {q(self.digest)}' if self.digest is not None else ""
        return (f'{surt(self.url)} {timestamp14(self.warc_date)} {{"url": {q(self.url)}{mime}{status}{digest}, '
                f'"length": {q(str(self.length))}, "offset": {q(str(self.offset))}, '
                f'"filename": {q(self.filename)}}}')


def status_of(http_head: bytes) -> str | None:
    """The status code token of an HTTP status line (``HTTP/1.1 200 OK`` -> ``200``), None if no head."""
    line = http_head.split(b"\n", 1)[0].strip()
    if not line:
        return None
    parts = line.split(None, 2)
    return parts[1].decode("latin-1") if len(parts) >= 2 else None


def iter_lines(path: str) -> Iterator[str]:
    """CDXJ lines, in record order (unsorted), for the indexed records of one segment
    (.warc.gz or .warc.gz.open). Reads until the first member that is not a whole record."""
    filename = os.path.basename(path).removesuffix(".open")
    with open(path, "rb") as f:
        for member in iter_members(f):
            try:
                head = check_member(member)
            except (BadRecord, ValueError):
                return
            rtype = head.type
            if rtype not in INDEXED_TYPES:
                continue
            ctype = head.get("Content-Type")
            if rtype in ("resource", "metadata") and ctype == _FIELDS_TYPE:
                continue
            block = member.head[head.block_offset:head.block_offset + head.content_length]
            status = mime = None
            if rtype in ("response", "revisit"):
                http_head = http_split(block)[0] if block else b""
                status = status_of(http_head) if http_head.startswith(b"HTTP/") else None
                if rtype == "revisit":
                    mime = "warc/revisit"
                elif status is not None:
                    mime = mime_of(http_header(http_head, b"content-type"))
            else:
                mime = mime_of(ctype)
            yield Capture(url=head.get("WARC-Target-URI", "") or "", warc_date=head.get("WARC-Date", "") or "",
                          mime=mime, status=status, digest=head.get("WARC-Payload-Digest"),
                          length=member.length, offset=member.offset, filename=filename).line()


def index(path: str) -> list[str]:
    """The sorted CDXJ lines of one segment, in a list (tests, small files; see :func:`write_index`)."""
    return sorted(set(iter_lines(path)), key=lambda s: s.encode("utf-8"))


def write_index(path: str, target: str, *, buffer_bytes: int = linesort.DEFAULT_BUFFER_BYTES) -> int:
    """Index segment ``path`` into ``target`` (sorted, atomically, RAM bounded); return the line count."""
    return linesort.sort_lines((line.encode("utf-8") for line in iter_lines(path)), target,
                               buffer_bytes=buffer_bytes)


def cdxj_path(segment_path: str, index_dir: str | None = None) -> str:
    """Where a segment's CDXJ goes: ``<index_dir>/<segment name without .warc.gz>.cdxj``."""
    name = os.path.basename(segment_path).removesuffix(".open").removesuffix(".gz").removesuffix(".warc")
    return os.path.join(index_dir or os.path.dirname(segment_path), name + ".cdxj")
