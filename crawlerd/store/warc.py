"""WARC/1.1 segment writer: one writer per process, records appended to rotating segments.

A segment is ``<prefix>-<UTC YYYYMMDDHHMMSSffffff>-<serial>-<hostname>-<shard>.warc.gz``
and carries the suffix ``.open`` while it is written. Every record is its own
gzip member (WARC/1.1 annex D.2); the first record of a segment is ``warcinfo``.
A capture is written as one group, in this order, never split across segments:

``request``   the request as sent; WARC-Concurrent-To the record after it
``response``  the answer as received (or ``revisit``, below); WARC-Concurrent-To the request
``metadata``  ``application/warc-fields`` about the capture (outlinks, simhash, robots
              directives, fetch time, ...); WARC-Concurrent-To the response or revisit

Revisits (WARC/1.1 §6.7.2, §6.7.3): an exact duplicate payload is an
``identical-payload-digest`` revisit whose block is the response head
(``WARC-Truncated: length``); a 304 answer to a conditional GET is a
``server-not-modified`` revisit with no block, whose WARC-Payload-Digest is the
digest of the payload it confirms (§6.7.3: "the payload is defined as the
original payload content"). Both carry WARC-Refers-To-Target-URI / -Date and,
when known, WARC-Refers-To naming the record that holds the payload. Replay
engines that take HTTP headers from a revisit (pywb) then serve that payload
instead of an empty 304. WARC-Protocol (IIPC proposal, ALPN ids) names the HTTP
version seen on the status line.

Invariant: only a ``.open`` segment is ever appended to; a segment without
``.open`` is complete and has a sorted CDXJ beside it in the index directory
(``recover.py`` re-establishes this after a crash).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

from crawlerd.store import cdxj, linesort
from crawlerd.store.encoding import (
    COMPRESSORS,
    CRLF2,
    WARC_VERSION,
    RecordIds,
    available_compressors,
    default_compressor,
    digest_of,
    field_value,
    fields_block,
    stored_body_member,
    warc_date,
    warc_uri,
)
from crawlerd.store.fsync import fsync_dir
from crawlerd.store.segment import OPEN_SUFFIX, create_next, dechunk, is_chunked

IDENTICAL_PAYLOAD_PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
REVISIT_PROFILE = IDENTICAL_PAYLOAD_PROFILE
CONFORMS_TO = "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
_TYPE_REQUEST = b"Content-Type: application/http;msgtype=request\r\n"
_TYPE_RESPONSE = b"Content-Type: application/http;msgtype=response\r\n"
_TYPE_FIELDS = b"Content-Type: application/warc-fields\r\n"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._]+")
_ALPN = {b"HTTP/1.0": "http/1.0", b"HTTP/1.1": "http/1.1", b"HTTP/2": "h2", b"HTTP/2.0": "h2", b"HTTP/3": "h3"}


class WarcLocation(NamedTuple):
    """Where a record lives: segment file name (final name, no directory), member offset and
    length; ``record_id`` is its WARC-Record-ID (``urn:uuid:...``, no angle brackets)."""

    filename: str
    offset: int
    length: int
    record_id: str = ""


def protocol_of(response_head: bytes) -> str:
    """WARC-Protocol value (an ALPN id, RFC 7301 registry) for a response's status line, "" if unknown."""
    return _ALPN.get(response_head[:12].split(b" ", 1)[0], "")


def _ip_field(ip: str) -> str:
    return f"WARC-IP-Address: {field_value(ip)}\r\n" if ip else ""


def _protocol_field(protocol: str) -> str:
    return f"WARC-Protocol: {protocol}\r\n" if protocol else ""


def _content_headers(response_head: bytes) -> tuple[bytes | None, bytes | None]:
    """(Content-Type, Content-Encoding) of a response head, the first of each as ``http_header``
    gives it, in one pass over the lines."""
    ctype = coding = None
    for line in response_head.split(b"\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep:
            key = key.strip().lower()
            if key == b"content-type":
                if ctype is None:
                    ctype = value.strip()
            elif key == b"content-encoding" and coding is None:
                coding = value.strip()
    return ctype, coding


class WarcWriter:
    """Append records to rotating WARC segments in ``directory``; one writer per process.

    Key: the segment ``current_path`` (``None`` until the first record). Invariants:
    only the ``.open`` segment is appended to; ``_size`` is its length on disk plus the
    bytes still buffered, so returned offsets are exact; each record is one gzip member;
    a capture's records are in one segment. Records are buffered up to ``buffer_bytes``;
    ``flush()`` hands them to the OS (and fsyncs when ``fsync``), so call it before
    acknowledging work: a crash then loses at most a torn last capture, which recovery cuts.
    Index lines go to an unsorted sidecar; ``close()`` sorts it with at most
    ``index_sort_buffer_bytes`` of lines in RAM (``linesort``), in a child process when
    ``index_sort_in_child`` (a long-lived writer: the buffer's swing is then not its own).
    """

    def __init__(self, directory: str, *, prefix: str = "crawlerd", segment_max_bytes: int = 1 << 30,
                 hostname: str | None = None, shard: str = "0", software: str = "crawlerd/0.1",
                 operator: str = "", user_agent: str = "", clock: Callable[[], float] = time.time,
                 id_gen: Callable[[], str] | None = None, compressor: str | None = None,
                 compress_level: int | None = None, buffer_bytes: int = 1 << 20, fsync: bool = False,
                 index_dir: str | None = None, index_sort_buffer_bytes: int = linesort.DEFAULT_BUFFER_BYTES,
                 index_sort_in_child: bool = False):
        compressor = compressor or default_compressor()
        if compressor not in available_compressors():
            raise ValueError(f"compressor {compressor!r} is not available: expected "
                             + " or ".join(available_compressors()))
        module, max_level, default_level = COMPRESSORS[compressor]
        compress_level = default_level if compress_level is None else compress_level
        if not 0 <= compress_level <= max_level:
            raise ValueError(f"compress_level for {compressor} must be 0..{max_level}, got {compress_level}")
        if segment_max_bytes < 1:
            raise ValueError(f"segment_max_bytes must be positive, got {segment_max_bytes}")
        if index_sort_buffer_bytes < 1:
            raise ValueError(f"index_sort_buffer_bytes must be positive, got {index_sort_buffer_bytes}")
        self.directory = directory
        self.index_dir = index_dir or directory
        self.prefix = _UNSAFE_NAME.sub("_", prefix)
        self.hostname = _UNSAFE_NAME.sub("_", hostname or socket.gethostname())
        self.shard = _UNSAFE_NAME.sub("_", shard)
        self.segment_max_bytes = segment_max_bytes
        self.index_sort_buffer_bytes = index_sort_buffer_bytes
        self.index_sort_in_child = index_sort_in_child
        self.software = software
        self.operator = operator
        self.user_agent = user_agent
        self.compressor = compressor
        self.compress_level = compress_level
        self._deflate = module.compress
        self._compressobj = module.compressobj
        self.buffer_bytes = buffer_bytes
        self.fsync = fsync
        self._clock = clock
        self._id_gen = id_gen or RecordIds()
        os.makedirs(directory, exist_ok=True)
        os.makedirs(self.index_dir, exist_ok=True)
        self._serial = self._next_serial()
        self._file = None            # raw file of the .open segment
        self._index = None           # unsorted CDXJ lines of the open segment (sidecar file)
        self._name = ""              # final name of the open segment
        self._size = 0               # bytes of the open segment, written or buffered
        self._on_disk = 0            # bytes of the open segment handed to the OS
        self.records_written = 0
        self.bytes_written = 0       # compressed bytes over all segments, buffered included
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._warcinfo_id = ""
        self.segments_closed: list[str] = []   # final paths of the segments this writer closed, in order

    # -- public API ---------------------------------------------------------

    @property
    def current_path(self) -> str | None:
        """Path of the ``.open`` segment being written, or None between segments."""
        if self._file is None:
            return None
        return os.path.join(self.directory, self._name + OPEN_SUFFIX)

    def write_fetch(self, *, url: str, fetched_at: float, ip: str, request_head: bytes, response_head: bytes,
                    body: bytes, payload_digest: str | None = None, metadata=None,
                    truncated: str | None = None) -> WarcLocation:
        """Write request + response (+ metadata) records; return the response record's location.

        ``body`` is as received; the payload digest is taken over it with chunked
        transfer coding removed unless ``payload_digest`` is given. ``truncated``
        sets WARC-Truncated (``length``, ``time``, ``disconnect``) when the body was cut.
        ``metadata``: fields (dict or (name, value) pairs) for a concurrent metadata record.
        """
        self._ensure_segment()
        req_id, resp_id = self._id_gen(), self._id_gen()
        date = warc_date(fetched_at)
        uri = warc_uri(url)
        proto = protocol_of(response_head)
        if payload_digest is None:
            payload_digest = digest_of(dechunk(body) if is_chunked(response_head) else body)
        self._request(uri, date, ip, proto, request_head, req_id, resp_id)
        extra = f"WARC-Truncated: {field_value(truncated)}\r\n" if truncated else ""
        head = (f"WARC-Type: response\r\nWARC-Record-ID: <{resp_id}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\n{_ip_field(ip)}{_protocol_field(proto)}"
                f"WARC-Concurrent-To: <{req_id}>\r\nWARC-Warcinfo-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Block-Digest: {digest_of(response_head, body)}\r\n"
                f"WARC-Payload-Digest: {payload_digest}\r\n{extra}").encode()
        ctype, coding = _content_headers(response_head)
        # a content-coded body (gzip, br, ...) is not deflated again
        if body and coding is not None and coding.lower() not in (b"", b"identity") and self.compress_level > 0:
            loc = self._append_stored_body(head + _TYPE_RESPONSE, response_head, body, resp_id)
        else:
            loc = self._append(head + _TYPE_RESPONSE, response_head, body, resp_id)
        status = cdxj.status_of(response_head) if response_head.startswith(b"HTTP/") else None
        self._index_line(uri, date, status, cdxj.mime_of(ctype) if status is not None else None,
                         payload_digest, loc)
        if metadata:
            self._metadata(uri, date, resp_id, metadata)
        self._after_write()
        return loc

    def write_revisit(self, *, url: str, fetched_at: float, ip: str, request_head: bytes, response_head: bytes,
                      payload_digest: str | None, refers_to_uri: str, refers_to_date: float,
                      refers_to_id: str | None = None, profile: str = IDENTICAL_PAYLOAD_PROFILE,
                      metadata=None) -> WarcLocation:
        """Write request + revisit (+ metadata); return the revisit record's location.

        ``profile`` :data:`IDENTICAL_PAYLOAD_PROFILE`: the block is the response head
        (WARC-Truncated: length), ``payload_digest`` the (identical) payload's.
        :data:`NOT_MODIFIED_PROFILE`: ``response_head`` is the 304 (its protocol is
        recorded), the block is empty, ``payload_digest`` is the confirmed payload's.
        """
        if profile not in (IDENTICAL_PAYLOAD_PROFILE, NOT_MODIFIED_PROFILE):
            raise ValueError(f"unknown revisit profile {profile!r}")
        self._ensure_segment()
        req_id, rev_id = self._id_gen(), self._id_gen()
        date = warc_date(fetched_at)
        uri = warc_uri(url)
        proto = protocol_of(response_head)
        self._request(uri, date, ip, proto, request_head, req_id, rev_id)
        identical = profile == IDENTICAL_PAYLOAD_PROFILE
        block = response_head if identical else b""
        refers = f"WARC-Refers-To: <{refers_to_id}>\r\n" if refers_to_id else ""
        digest = f"WARC-Payload-Digest: {payload_digest}\r\n" if payload_digest else ""
        tail = "WARC-Truncated: length\r\n" if identical else ""
        head = (f"WARC-Type: revisit\r\nWARC-Record-ID: <{rev_id}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\n{_ip_field(ip)}{_protocol_field(proto)}"
                f"WARC-Concurrent-To: <{req_id}>\r\nWARC-Warcinfo-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Profile: {profile}\r\n{refers}WARC-Refers-To-Target-URI: {warc_uri(refers_to_uri)}\r\n"
                f"WARC-Refers-To-Date: {warc_date(refers_to_date)}\r\n"
                f"WARC-Block-Digest: {digest_of(block)}\r\n{digest}{tail}").encode()
        loc = self._append(head + (_TYPE_RESPONSE if identical else b""), block, b"", rev_id)
        self._index_line(uri, date, cdxj.status_of(block) if block.startswith(b"HTTP/") else None,
                         "warc/revisit", payload_digest, loc)
        if metadata:
            self._metadata(uri, date, rev_id, metadata)
        self._after_write()
        return loc

    @property
    def size(self) -> int:
        """Bytes of the open segment, buffered records included (on disk after :meth:`flush`);
        0 between segments."""
        return self._size if self._file is not None else 0

    def flush(self) -> None:
        """Hand buffered records to the OS (fsync too when ``fsync``). The CDXJ sidecar is left
        to its file buffer: recovery indexes a segment from its records, never from the sidecar."""
        if self._file is None:
            return
        self._drain()
        if self.fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the open segment: write its sorted CDXJ, then rename ``.open`` away. Idempotent."""
        if self._file is None:
            return
        self._drain()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        index_open = self._index.name
        self._index.close()
        self._index = None
        final = os.path.join(self.directory, self._name)
        sort = linesort.sort_file_in_child if self.index_sort_in_child else linesort.sort_file
        sort(index_open, cdxj.cdxj_path(final, self.index_dir), buffer_bytes=self.index_sort_buffer_bytes)
        os.remove(index_open)
        os.rename(final + OPEN_SUFFIX, final)
        fsync_dir(self.directory)
        self.segments_closed.append(final)

    def __enter__(self) -> WarcWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- records ------------------------------------------------------------

    def _request(self, uri: str, date: str, ip: str, proto: str, request_head: bytes, req_id: str,
                 other_id: str) -> None:
        head = (f"WARC-Type: request\r\nWARC-Record-ID: <{req_id}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\n{_ip_field(ip)}{_protocol_field(proto)}"
                f"WARC-Concurrent-To: <{other_id}>\r\nWARC-Warcinfo-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Block-Digest: {digest_of(request_head)}\r\n").encode()
        self._append(head + _TYPE_REQUEST, request_head, b"")

    def _metadata(self, uri: str, date: str, about_id: str, metadata) -> None:
        block = fields_block(metadata)
        head = (f"WARC-Type: metadata\r\nWARC-Record-ID: <{self._id_gen()}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\nWARC-Concurrent-To: <{about_id}>\r\n"
                f"WARC-Warcinfo-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Block-Digest: {digest_of(block)}\r\n").encode()
        self._append(head + _TYPE_FIELDS, block, b"")

    def _warcinfo(self) -> None:
        self._warcinfo_id = self._id_gen()
        fields = {"software": self.software, "format": "WARC File Format 1.1", "conformsTo": CONFORMS_TO,
                  "hostname": self.hostname}
        if self.operator:
            fields["operator"] = self.operator
        if self.user_agent:
            fields["http-header-user-agent"] = self.user_agent
        fields["robots"] = "classic"
        block = fields_block(fields)
        head = (f"WARC-Type: warcinfo\r\nWARC-Record-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Date: {warc_date(self._clock())}\r\nWARC-Filename: {self._name}\r\n"
                f"WARC-Block-Digest: {digest_of(block)}\r\n").encode()
        self._append(head + _TYPE_FIELDS, block, b"")

    def _append(self, head: bytes, block_a: bytes, block_b: bytes, record_id: str = "") -> WarcLocation:
        """Compress one record (header + block) into one gzip member and buffer it."""
        length = len(block_a) + len(block_b)
        data = b"".join((WARC_VERSION, head, b"Content-Length: %d\r\n\r\n" % length, block_a, block_b, CRLF2))
        return self._buffer(self._deflate(data, self.compress_level, 31), record_id)

    def _append_stored_body(self, head: bytes, block_a: bytes, body: bytes, record_id: str) -> WarcLocation:
        """Like ``_append``, for a body that is already compressed (content-coded): the headers
        are deflated, the body goes in stored blocks; still one gzip member."""
        data = b"".join((WARC_VERSION, head, b"Content-Length: %d\r\n\r\n" % (len(block_a) + len(body)),
                         block_a))
        return self._buffer(stored_body_member(self._compressobj, self.compress_level, data, body), record_id)

    def _buffer(self, member: bytes, record_id: str) -> WarcLocation:
        loc = WarcLocation(self._name, self._size, len(member), record_id)
        self._buf.append(member)
        self._buf_bytes += len(member)
        self._size += len(member)
        self.records_written += 1
        self.bytes_written += len(member)
        return loc

    def _index_line(self, uri: str, date: str, status: str | None, mime: str | None, digest: str | None,
                    loc: WarcLocation) -> None:
        cap = cdxj.Capture(url=uri, warc_date=date, mime=mime, status=status, digest=digest,
                           length=loc.length, offset=loc.offset, filename=loc.filename)
        self._index.write(cap.line() + "\n")

    # -- segments -----------------------------------------------------------

    def _after_write(self) -> None:
        if self._size >= self.segment_max_bytes:
            self.close()            # the next record opens the next segment
        elif self._buf_bytes >= self.buffer_bytes:
            self._drain()

    def _drain(self) -> None:
        if not self._buf:
            return
        data = memoryview(b"".join(self._buf))
        self._buf.clear()
        self._buf_bytes = 0
        try:
            while data:
                n = self._file.write(data)
                data = data[n:]
        except OSError:
            self._abandon_segment()
            raise
        self._on_disk = self._size

    def _abandon_segment(self) -> None:
        """After a failed write (disk full, I/O error): cut the segment back to its last whole
        write and close it, indexed from its content. Buffered records are lost and the caller
        sees the error; the next record opens a new segment. If this fails too, recovery
        finishes the job at the next start."""
        path, file, index = self.current_path, self._file, self._index
        self._file = self._index = None
        self._buf.clear()
        self._buf_bytes = 0
        try:
            file.truncate(self._on_disk)
            file.close()
            index.close()
            os.remove(index.name)
            if self._on_disk == 0:
                os.remove(path)
                return
            final = path[:-len(OPEN_SUFFIX)]
            cdxj.write_index(path, cdxj.cdxj_path(final, self.index_dir),
                             buffer_bytes=self.index_sort_buffer_bytes)
            os.rename(path, final)
            self.segments_closed.append(final)
        except OSError:
            pass    # left as .open for recovery; the original error is what the caller needs

    def _ensure_segment(self) -> None:
        if self._file is not None:
            return
        stamp = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y%m%d%H%M%S%f")
        self._file, path, self._serial = create_next(
            self.directory, lambda n: f"{self.prefix}-{stamp}-{n:05d}-{self.hostname}-{self.shard}.warc.gz",
            self._serial)
        self._name = os.path.basename(path)
        self._size = 0
        self._on_disk = 0
        self._index = open(cdxj.cdxj_path(path, self.index_dir) + OPEN_SUFFIX, "w", encoding="utf-8")
        self._warcinfo()

    def _next_serial(self) -> int:
        """Serials continue across restarts for this prefix, host and shard."""
        pat = re.compile(rf"{re.escape(self.prefix)}-\d{{20}}-(\d+)-{re.escape(self.hostname)}-"
                         rf"{re.escape(self.shard)}\.warc\.gz(\.open)?$")
        serials = [int(m.group(1)) for n in os.listdir(self.directory) if (m := pat.match(n))]
        return max(serials) + 1 if serials else 0
