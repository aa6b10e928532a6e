"""The bytes of a WARC record: digests, dates, record ids, field values and gzip members.

Shared by the writer (``warc.py``), recovery and verification. Every record is
its own gzip member (WARC/1.1 annex D.2); a member's header has mtime 0 so the
same records give the same bytes. A body that is already content-coded (gzip,
br, ...) goes into stored deflate blocks (:func:`stored_body_member`): deflating
it again cost most of a record's CPU and saved nothing (bench/process_bench.py).
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from datetime import UTC, datetime

from crawlerd._native.b32 import sha1_base32  # noqa: F401 (re-exported: crawlerd.store.sha1_base32)

try:  # ISA-L deflate: ~3x faster than zlib at a similar ratio (bench/warc_bench.py)
    from isal import isal_zlib as _isal_zlib
except ImportError:  # pragma: no cover - depends on the environment
    _isal_zlib = None
_crc32 = _isal_zlib.crc32 if _isal_zlib is not None else zlib.crc32

WARC_VERSION = b"WARC/1.1\r\n"
CRLF2 = b"\r\n\r\n"
# gzip back ends: (module, highest level, default level), defaults from bench/warc_bench.py.
# isal 2: ~5% larger than zlib 6 at a quarter of its time; zlib 1 is the fast fallback (~10% larger).
COMPRESSORS = {"zlib": (zlib, 9, 1), "isal": (_isal_zlib, 3, 2)}
# gzip member header (RFC 1952 §2.3): deflate, no flags, mtime 0 (reproducible bytes), OS unknown.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
_STORED_MAX = 65535                   # bytes per stored deflate block (RFC 1951 §3.2.4)
_STORED_HEAD = struct.Struct("<BHH")  # BFINAL|BTYPE=00 (byte-aligned), LEN, NLEN
_GZIP_TRAILER = struct.Struct("<II")  # CRC32, ISIZE


def available_compressors() -> list[str]:
    """gzip back ends usable here (``isal`` needs the isal package)."""
    return [name for name, (module, _, _) in COMPRESSORS.items() if module is not None]


def default_compressor() -> str:
    """``isal`` when the isal package is installed, else ``zlib``."""
    return "isal" if _isal_zlib is not None else "zlib"


def gzip_member(data: bytes, compressor: str = "zlib", level: int = 6) -> bytes:
    """``data`` as one gzip member (RFC 1952), header mtime 0 so the bytes are reproducible."""
    return COMPRESSORS[compressor][0].compress(data, level, 31)


def stored_body_member(compressobj, level: int, head: bytes, body: bytes) -> bytes:
    """One gzip member of ``head + body + CRLF CRLF``: ``head`` deflated, ``body`` (already
    compressed) in stored blocks (RFC 1951 §3.2.4). Any gzip reader inflates it as usual."""
    c = compressobj(level, zlib.DEFLATED, -15)
    # a sync flush ends the head's deflate blocks non-final and byte-aligned
    parts = [_GZIP_HEADER, c.compress(head), c.flush(zlib.Z_SYNC_FLUSH)]
    view = memoryview(body)
    for i in range(0, len(body), _STORED_MAX):
        piece = view[i:i + _STORED_MAX]
        parts += (_STORED_HEAD.pack(0, len(piece), len(piece) ^ 0xFFFF), piece)
    parts += (_STORED_HEAD.pack(1, len(CRLF2), len(CRLF2) ^ 0xFFFF), CRLF2,
              _GZIP_TRAILER.pack(_crc32(CRLF2, _crc32(body, _crc32(head))),
                                 (len(head) + len(body) + len(CRLF2)) & 0xFFFFFFFF))
    return b"".join(parts)


def payload_digest(body_dechunked: bytes) -> str:
    """WARC-Payload-Digest of an entity body with transfer coding removed: ``sha1:`` + base32."""
    return "sha1:" + sha1_base32(hashlib.sha1(body_dechunked).digest())


def digest_of(*parts: bytes) -> str:
    """``sha1:`` + base32 of the concatenation of ``parts`` (a WARC-Block-Digest)."""
    h = hashlib.sha1()
    for p in parts:
        h.update(p)
    return "sha1:" + sha1_base32(h.digest())


def warc_date(ts: float) -> str:
    """WARC-Date with microseconds (WARC/1.1 §5.4 allows fractions of a second)."""
    # rounds to the microsecond (half even); "YYYY-MM-DDTHH:MM:SS.ffffff+00:00" -> "...ffffffZ"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")[:-6] + "Z"


_forks = 0     # forks this process was born of (RecordIds: a child draws its own random bytes)


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class RecordIds:
    """Random (version 4, RFC 9562 §5.4) record ids, ``urn:uuid:...``, from os.urandom read 4 KiB
    at a time: one system call per 256 ids instead of one per id.

    Invariant: ``_pool[_pos:]`` are random bytes no id has used, read by this process: a
    forked child reads its own (``_forks`` moves at a fork), so parent and child never share
    an id. A fork counter instead of ``os.getpid()`` per id: that is a system call, ~0.8 us
    here, three times per page in a worker.
    """

    def __init__(self):
        self._pool = b""
        self._pos = 0
        self._forks = -1

    def __call__(self) -> str:
        pos = self._pos
        if pos >= 4096 or self._forks != _forks:
            self._pool, pos, self._forks = os.urandom(4096), 0, _forks
        h = self._pool[pos:pos + 16].hex()
        self._pos = pos + 16
        # version nibble 4; variant bits 10 (RFC 9562 §4.1): the first hex digit of group 4 is 8..b
        return f"urn:uuid:{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def field_value(value: str) -> str:
    """A WARC field value on one line (WARC/1.1 §4: no CR/LF), so the byte length stays honest."""
    return value.replace("\r", "%0D").replace("\n", "%0A")


def warc_uri(url: str) -> str:
    """A URI for WARC-Target-URI and friends: no CR, LF or space."""
    return url.replace("\r", "%0D").replace("\n", "%0A").replace(" ", "%20")


def fields_block(fields) -> bytes:
    """An ``application/warc-fields`` block from a dict or a list of (name, value) pairs
    (names may repeat: one ``outlink`` per link)."""
    items = fields.items() if isinstance(fields, dict) else fields
    text = "".join([f"{k}: {v}\r\n" for k, v in items])
    n = len(items)
    # one CR and one LF per line and no ":" in a name: nothing to escape (the common case, one scan)
    if text.count("\r") != n or text.count("\n") != n or any(":" in k for k, _ in items):
        text = "".join(f"{field_value(k).replace(':', '_')}: {field_value(v)}\r\n" for k, v in items)
    return text.encode("utf-8")
