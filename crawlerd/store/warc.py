"""WARC/1.1 segment writer and crash recovery.

A segment is ``<prefix>-<UTC YYYYMMDDHHMMSSffffff>-<serial>-<hostname>-<shard>.warc.gz``
and carries the suffix ``.open`` while it is written. Every record is its own
gzip member (WARC/1.1 annex D.2), so a reader can seek to any record and a
torn tail can be cut at a member boundary. The first record is ``warcinfo``.
A response whose body is already content-coded (gzip, br, ...) has its headers
deflated and its body in stored deflate blocks: deflating such a body cost most
of the record's CPU and saved nothing (bench/process_bench.py).

Invariant: only a ``.open`` segment is ever appended to; a segment without
``.open`` is complete and has a sorted CDXJ beside it in the index directory.
``recover()`` re-establishes this after a crash.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import struct
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

from crawlerd.store import cdxj
from crawlerd.store.segment import (
    OPEN_SUFFIX,
    BadRecord,
    check_member,
    create_next,
    dechunk,
    http_header,
    http_status,
    is_chunked,
    iter_members,
)

try:  # ISA-L deflate: ~3x faster than zlib at a similar ratio (bench/warc_bench.py)
    from isal import isal_zlib as _isal_zlib
except ImportError:  # pragma: no cover - depends on the environment
    _isal_zlib = None
_crc32 = _isal_zlib.crc32 if _isal_zlib is not None else zlib.crc32

WARC_VERSION = b"WARC/1.1\r\n"
REVISIT_PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
CONFORMS_TO = "http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"
_CRLF2 = b"\r\n\r\n"
_TYPE_REQUEST = b"Content-Type: application/http;msgtype=request\r\n"
_TYPE_RESPONSE = b"Content-Type: application/http;msgtype=response\r\n"
_TYPE_FIELDS = b"Content-Type: application/warc-fields\r\n"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._]+")
# gzip back ends: (module, highest level, default level), defaults from bench/warc_bench.py.
# isal 2: ~5% larger than zlib 6 at a quarter of its time; zlib 1 is the fast fallback (~10% larger).
_COMPRESSORS = {"zlib": (zlib, 9, 1), "isal": (_isal_zlib, 3, 2)}
# gzip member header (RFC 1952 §2.3): deflate, no flags, mtime 0 (reproducible bytes), OS unknown.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_STORED_MAX = 65535                   # bytes per stored deflate block (RFC 1951 §3.2.4)
_STORED_HEAD = struct.Struct("<BHH")  # BFINAL|BTYPE=00 (byte-aligned), LEN, NLEN
_GZIP_TRAILER = struct.Struct("<II")  # CRC32, ISIZE


def available_compressors() -> list[str]:
    """gzip back ends usable here (``isal`` needs the isal package)."""
    return [name for name, (module, _, _) in _COMPRESSORS.items() if module is not None]


def default_compressor() -> str:
    """``isal`` when the isal package is installed, else ``zlib``."""
    return "isal" if _isal_zlib is not None else "zlib"


def gzip_member(data: bytes, compressor: str = "zlib", level: int = 6) -> bytes:
    """``data`` as one gzip member (RFC 1952), header mtime 0 so the bytes are reproducible."""
    return _COMPRESSORS[compressor][0].compress(data, level, 31)


class WarcLocation(NamedTuple):
    """Where a record lives: segment file name (final name, no directory), member offset and length."""

    filename: str
    offset: int
    length: int


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"           # RFC 4648 §6 alphabet
_B32_PAIRS = [_B32[i >> 5] + _B32[i & 31] for i in range(1024)]     # 10 bits -> 2 characters


def sha1_base32(digest: bytes) -> str:
    """Base32 (RFC 4648 §6) of a 20-byte SHA-1 digest: 160 bits, 32 characters, no padding.

    Written out because ``base64.b32encode`` is pure Python and took as long as hashing
    a 2 KB block; an exact test holds it to ``base64.b32encode``.
    """
    n = int.from_bytes(digest, "big")
    t = _B32_PAIRS
    return (t[n >> 150] + t[(n >> 140) & 1023] + t[(n >> 130) & 1023] + t[(n >> 120) & 1023]
            + t[(n >> 110) & 1023] + t[(n >> 100) & 1023] + t[(n >> 90) & 1023] + t[(n >> 80) & 1023]
            + t[(n >> 70) & 1023] + t[(n >> 60) & 1023] + t[(n >> 50) & 1023] + t[(n >> 40) & 1023]
            + t[(n >> 30) & 1023] + t[(n >> 20) & 1023] + t[(n >> 10) & 1023] + t[n & 1023])


def payload_digest(body_dechunked: bytes) -> str:
    """WARC-Payload-Digest of an entity body with transfer coding removed: ``sha1:`` + base32."""
    return "sha1:" + sha1_base32(hashlib.sha1(body_dechunked).digest())


def _digest_of(*parts: bytes) -> str:
    h = hashlib.sha1()
    for p in parts:
        h.update(p)
    return "sha1:" + sha1_base32(h.digest())


def warc_date(ts: float) -> str:
    """WARC-Date with microseconds (WARC/1.1 §5.4 allows fractions of a second)."""
    d = datetime.fromtimestamp(ts, UTC)     # rounds to the microsecond (half even), as strftime saw it
    return (f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"
            f".{d.microsecond:06d}Z")


class _UuidIds:
    """Random (version 4, RFC 9562 §5.4) record ids, ``urn:uuid:...``, from os.urandom read 4 KiB
    at a time: one system call per 256 ids instead of one per id.

    Invariant: ``_pool[_pos:]`` are random bytes no id has used, read by this process
    (``_pid``): a forked child reads its own, so parent and child never share an id.
    """

    def __init__(self):
        self._pool = b""
        self._pos = 0
        self._pid = 0

    def __call__(self) -> str:
        if self._pos >= len(self._pool) or self._pid != os.getpid():
            self._pool, self._pos, self._pid = os.urandom(4096), 0, os.getpid()
        h = self._pool[self._pos:self._pos + 16].hex()
        self._pos += 16
        # version nibble 4; variant bits 10 (RFC 9562 §4.1): the first hex digit of group 4 is 8..b
        return f"urn:uuid:{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def _field_value(value: str) -> str:
    # A field value is one line (WARC/1.1 §4: no CR/LF); keep the byte length honest.
    return value.replace("\r", "%0D").replace("\n", "%0A")


def _uri(url: str) -> str:
    return url.replace("\r", "%0D").replace("\n", "%0A").replace(" ", "%20")


def _ip_field(ip: str) -> str:
    return f"WARC-IP-Address: {_field_value(ip)}\r\n" if ip else ""


def _content_coded(response_head: bytes) -> bool:
    """True when the response carries a content coding other than identity (gzip, br, ...)."""
    coding = http_header(response_head, b"content-encoding")
    return coding is not None and coding.strip().lower() not in (b"", b"identity")


def _fields_block(fields: dict[str, str]) -> bytes:
    return "".join(f"{_field_value(k).replace(':', '_')}: {_field_value(v)}\r\n"
                   for k, v in fields.items()).encode("utf-8")


class WarcWriter:
    """Append records to rotating WARC segments in ``directory``; one writer per process.

    Key: the segment ``current_path`` (``None`` until the first record). Invariants:
    only the ``.open`` segment is appended to; ``_size`` is its length on disk plus the
    bytes still buffered, so returned offsets are exact; each record is one gzip member.
    Records are buffered up to ``buffer_bytes``; ``flush()`` hands them to the OS (and
    fsyncs when ``fsync``), so call it before acknowledging work: a crash then loses at
    most a torn last record, which ``recover()`` cuts off.
    """

    def __init__(self, directory: str, *, prefix: str = "crawlerd", segment_max_bytes: int = 1 << 30,
                 hostname: str | None = None, shard: str = "0", software: str = "crawlerd/0.1",
                 operator: str = "", user_agent: str = "", clock: Callable[[], float] = time.time,
                 id_gen: Callable[[], str] | None = None, compressor: str | None = None,
                 compress_level: int | None = None, buffer_bytes: int = 1 << 20, fsync: bool = False,
                 index_dir: str | None = None):
        compressor = compressor or default_compressor()
        if compressor not in available_compressors():
            raise ValueError(f"compressor {compressor!r} is not available: expected "
                             + " or ".join(available_compressors()))
        module, max_level, default_level = _COMPRESSORS[compressor]
        compress_level = default_level if compress_level is None else compress_level
        if not 0 <= compress_level <= max_level:
            raise ValueError(f"compress_level for {compressor} must be 0..{max_level}, got {compress_level}")
        if segment_max_bytes < 1:
            raise ValueError(f"segment_max_bytes must be positive, got {segment_max_bytes}")
        self.directory = directory
        self.index_dir = index_dir or directory
        self.prefix = _UNSAFE_NAME.sub("_", prefix)
        self.hostname = _UNSAFE_NAME.sub("_", hostname or socket.gethostname())
        self.shard = _UNSAFE_NAME.sub("_", shard)
        self.segment_max_bytes = segment_max_bytes
        self.software = software
        self.operator = operator
        self.user_agent = user_agent
        self.compressor = compressor
        self.compress_level = compress_level
        self._deflate = module.compress
        self.buffer_bytes = buffer_bytes
        self.fsync = fsync
        self._clock = clock
        self._id_gen = id_gen or _UuidIds()
        self._compressobj = module.compressobj
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
                    body: bytes, payload_digest: str | None = None, metadata: dict[str, str] | None = None,
                    truncated: str | None = None) -> WarcLocation:
        """Write request + response (+ metadata) records; return the response record's location.

        ``body`` is as received; the payload digest is taken over it with chunked
        transfer coding removed unless ``payload_digest`` is given. ``truncated``
        sets WARC-Truncated (``length``, ``time``, ``disconnect``) when the body was cut.
        """
        self._ensure_segment()
        req_id, resp_id = self._id_gen(), self._id_gen()
        date = warc_date(fetched_at)
        uri = _uri(url)
        if payload_digest is None:
            payload_digest = _digest_of(dechunk(body) if is_chunked(response_head) else body)
        self._request(uri, date, ip, request_head, req_id, resp_id)
        extra = f"WARC-Truncated: {_field_value(truncated)}\r\n" if truncated else ""
        head = (f"WARC-Type: response\r\nWARC-Record-ID: <{resp_id}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\n{_ip_field(ip)}WARC-Concurrent-To: <{req_id}>\r\n"
                f"WARC-Warcinfo-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Block-Digest: {_digest_of(response_head, body)}\r\n"
                f"WARC-Payload-Digest: {payload_digest}\r\n{extra}").encode()
        if body and _content_coded(response_head) and self.compress_level > 0:
            loc = self._append_stored_body(head + _TYPE_RESPONSE, response_head, body)
        else:
            loc = self._append(head + _TYPE_RESPONSE, response_head, body)
        self._index_line(uri, date, response_head, payload_digest, loc, revisit=False)
        if metadata:
            self._metadata(uri, date, resp_id, metadata)
        self._after_write()
        return loc

    def write_revisit(self, *, url: str, fetched_at: float, ip: str, request_head: bytes, response_head: bytes,
                      payload_digest: str, refers_to_uri: str, refers_to_date: float,
                      refers_to_id: str | None = None) -> WarcLocation:
        """Write request + revisit (identical-payload-digest profile, WARC/1.1 §6.7.2); return the
        revisit record's location. The block is the response head only."""
        self._ensure_segment()
        req_id, rev_id = self._id_gen(), self._id_gen()
        date = warc_date(fetched_at)
        uri = _uri(url)
        self._request(uri, date, ip, request_head, req_id, rev_id)
        refers = f"WARC-Refers-To: <{refers_to_id}>\r\n" if refers_to_id else ""
        head = (f"WARC-Type: revisit\r\nWARC-Record-ID: <{rev_id}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\n{_ip_field(ip)}WARC-Concurrent-To: <{req_id}>\r\n"
                f"WARC-Warcinfo-ID: <{self._warcinfo_id}>\r\nWARC-Profile: {REVISIT_PROFILE}\r\n"
                f"{refers}WARC-Refers-To-Target-URI: {_uri(refers_to_uri)}\r\n"
                f"WARC-Refers-To-Date: {warc_date(refers_to_date)}\r\n"
                f"WARC-Block-Digest: {_digest_of(response_head)}\r\n"
                f"WARC-Payload-Digest: {payload_digest}\r\n").encode()
        loc = self._append(head + _TYPE_RESPONSE, response_head, b"")
        self._index_line(uri, date, response_head, payload_digest, loc, revisit=True)
        self._after_write()
        return loc

    def flush(self) -> None:
        """Hand buffered records to the OS (fsync too when ``fsync``)."""
        if self._file is None:
            return
        self._drain()
        self._index.flush()
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
        with open(index_open, encoding="utf-8") as f:
            lines = f.read().splitlines()
        final = os.path.join(self.directory, self._name)
        cdxj.write_lines(lines, cdxj.cdxj_path(final, self.index_dir))
        os.remove(index_open)
        os.rename(final + OPEN_SUFFIX, final)
        cdxj.fsync_dir(self.directory)
        self.segments_closed.append(final)

    def __enter__(self) -> WarcWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- records ------------------------------------------------------------

    def _request(self, uri: str, date: str, ip: str, request_head: bytes, req_id: str, other_id: str) -> None:
        head = (f"WARC-Type: request\r\nWARC-Record-ID: <{req_id}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\n{_ip_field(ip)}WARC-Concurrent-To: <{other_id}>\r\n"
                f"WARC-Warcinfo-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Block-Digest: {_digest_of(request_head)}\r\n").encode()
        self._append(head + _TYPE_REQUEST, request_head, b"")

    def _metadata(self, uri: str, date: str, about_id: str, metadata: dict[str, str]) -> None:
        block = _fields_block(metadata)
        head = (f"WARC-Type: metadata\r\nWARC-Record-ID: <{self._id_gen()}>\r\nWARC-Date: {date}\r\n"
                f"WARC-Target-URI: {uri}\r\nWARC-Concurrent-To: <{about_id}>\r\n"
                f"WARC-Warcinfo-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Block-Digest: {_digest_of(block)}\r\n").encode()
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
        block = _fields_block(fields)
        head = (f"WARC-Type: warcinfo\r\nWARC-Record-ID: <{self._warcinfo_id}>\r\n"
                f"WARC-Date: {warc_date(self._clock())}\r\nWARC-Filename: {self._name}\r\n"
                f"WARC-Block-Digest: {_digest_of(block)}\r\n").encode()
        self._append(head + _TYPE_FIELDS, block, b"")

    def _append(self, head: bytes, block_a: bytes, block_b: bytes) -> WarcLocation:
        """Compress one record (header + block) into one gzip member and buffer it."""
        length = len(block_a) + len(block_b)
        data = b"".join((WARC_VERSION, head, b"Content-Length: %d\r\n\r\n" % length, block_a, block_b, _CRLF2))
        return self._buffer(self._deflate(data, self.compress_level, 31))

    def _buffer(self, member: bytes) -> WarcLocation:
        loc = WarcLocation(self._name, self._size, len(member))
        self._buf.append(member)
        self._buf_bytes += len(member)
        self._size += len(member)
        self.records_written += 1
        self.bytes_written += len(member)
        return loc

    def _append_stored_body(self, head: bytes, block_a: bytes, body: bytes) -> WarcLocation:
        """Like ``_append``, for a body that is already compressed (content-coded): the headers
        are deflated, the body goes in stored blocks (RFC 1951 §3.2.4). Deflate would spend
        most of a record's time on such a body and save nothing; the member is still one
        gzip member (RFC 1952) any reader inflates."""
        length = len(block_a) + len(body)
        data = b"".join((WARC_VERSION, head, b"Content-Length: %d\r\n\r\n" % length, block_a))
        c = self._compressobj(self.compress_level, zlib.DEFLATED, -15)
        # a sync flush ends the headers' deflate blocks non-final and byte-aligned
        parts = [_GZIP_HEADER, c.compress(data), c.flush(zlib.Z_SYNC_FLUSH)]
        view = memoryview(body)
        for i in range(0, len(body), _STORED_MAX):
            piece = view[i:i + _STORED_MAX]
            parts += (_STORED_HEAD.pack(0, len(piece), len(piece) ^ 0xFFFF), piece)
        parts += (_STORED_HEAD.pack(1, len(_CRLF2), len(_CRLF2) ^ 0xFFFF), _CRLF2,
                  _GZIP_TRAILER.pack(_crc32(_CRLF2, _crc32(body, _crc32(data))),
                                     (len(data) + len(body) + len(_CRLF2)) & 0xFFFFFFFF))
        return self._buffer(b"".join(parts))

    def _index_line(self, uri: str, date: str, response_head: bytes, digest: str, loc: WarcLocation,
                    revisit: bool) -> None:
        mime = "warc/revisit" if revisit else cdxj.mime_of(http_header(response_head, b"content-type"))
        cap = cdxj.Capture(url=uri, warc_date=date, mime=mime, status=http_status(response_head),
                           digest=digest, length=loc.length, offset=loc.offset, filename=loc.filename)
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
        sees the error; the next record opens a new segment. If this fails too, ``recover()``
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
            cdxj.write_lines(cdxj.index(path), cdxj.cdxj_path(final, self.index_dir))
            os.rename(path, final)
            self.segments_closed.append(final)
        except OSError:
            pass    # left as .open for recover(); the original error is what the caller needs

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


def recover(directory: str, *, index_dir: str | None = None) -> list[str]:
    """Make every segment in ``directory`` complete and indexed after a crash; return what was done.

    Run it before any writer starts on the directory. Each ``*.warc.gz.open`` goes
    through :func:`recover_segment`; finished segments missing their CDXJ get one;
    stale CDXJ sidecars (``.cdxj.open``, ``.cdxj.tmp``) are removed.
    """
    index_dir = index_dir or directory
    done: list[str] = []
    if not os.path.isdir(directory):
        return done
    os.makedirs(index_dir, exist_ok=True)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".warc.gz" + OPEN_SUFFIX):
            done += recover_segment(os.path.join(directory, name), index_dir=index_dir)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".warc.gz"):
            path = os.path.join(directory, name)
            target = cdxj.cdxj_path(path, index_dir)
            if not os.path.exists(target):
                cdxj.write_lines(cdxj.index(path), target)
                done.append(f"indexed {name}")
    for name in sorted(os.listdir(index_dir)):
        if name.endswith(".cdxj" + OPEN_SUFFIX) or name.endswith(".cdxj.tmp"):
            os.remove(os.path.join(index_dir, name))
            done.append(f"removed stale {name}")
    return done


def recover_segment(path: str, *, index_dir: str | None = None) -> list[str]:
    """Close one segment whose writer died (``path`` with or without ``.open``); return what was done.

    Keeps the longest prefix of whole gzip members that parse as whole records,
    truncates the rest (torn record, garbage), fsyncs, writes the CDXJ, then renames
    to the final name. A segment with no record but its warcinfo is removed. A
    segment already closed only gets its CDXJ if that is missing.
    """
    final = path.removesuffix(OPEN_SUFFIX)
    open_path = final + OPEN_SUFFIX
    name = os.path.basename(open_path)
    index_dir = index_dir or os.path.dirname(final)
    target = cdxj.cdxj_path(final, index_dir)
    done: list[str] = []
    if not os.path.exists(open_path):
        if os.path.exists(final) and not os.path.exists(target):
            os.makedirs(index_dir, exist_ok=True)
            cdxj.write_lines(cdxj.index(final), target)
            done.append(f"indexed {os.path.basename(final)}")
        return done
    os.makedirs(index_dir, exist_ok=True)
    keep, records, data_records = _valid_prefix(open_path)
    size = os.path.getsize(open_path)
    if data_records == 0:
        os.remove(open_path)
        done.append(f"removed {name}: no complete data record ({size} bytes)")
    else:
        if keep < size:
            os.truncate(open_path, keep)
            done.append(f"truncated {name} from {size} to {keep} bytes ({records} records kept)")
        with open(open_path, "rb+") as f:
            os.fsync(f.fileno())
        cdxj.write_lines(cdxj.index(open_path), target)
        os.rename(open_path, final)
        done.append(f"closed {os.path.basename(final)}")
    sidecar = target + OPEN_SUFFIX
    if os.path.exists(sidecar):
        os.remove(sidecar)
    cdxj.fsync_dir(os.path.dirname(final) or ".")
    return done


def _valid_prefix(path: str) -> tuple[int, int, int]:
    """(bytes, records, non-warcinfo records) of the longest run of whole records from the start."""
    keep = records = data_records = 0
    with open(path, "rb") as f:
        for member in iter_members(f):
            try:
                head = check_member(member)
            except (BadRecord, ValueError):
                break
            keep = member.offset + member.length
            records += 1
            if head.type != "warcinfo":
                data_records += 1
    return keep, records, data_records
