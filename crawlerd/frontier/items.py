"""What the frontier hands in and out, and how it lays those out on disk.

:class:`QueuedURL` is a URL waiting in (or leased from) a per-host back queue;
:class:`Lease` is one fetch the shard may make now. The byte layouts below are
the LMDB keys and values of ``queues.py``; keys are big-endian so that LMDB's
byte order is the queue order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

KIND_URL = "url"
KIND_ROBOTS = "robots"
PRIORITY_DEFERRED = 255      # QueuedURL.priority: the frontier's deferred level (if it has one)


@dataclass(slots=True)
class QueuedURL:
    url: str                 # absolute, normalised URL
    host_key: str            # scheme://host[:port], the politeness key
    priority: int = 0        # front-queue level, 0 is highest (clamped to the frontier's levels);
                             # PRIORITY_DEFERRED: after every other level of the host
    depth: int = 0           # link depth from a seed
    hops: int = 0            # redirect/embed hops (passed through for the shard)
    fp: int = 0              # 64-bit URL fingerprint (unsigned), passed through
    attempts: int = 0        # failed fetch attempts so far (retries count up to max_attempts)


@dataclass(slots=True)
class Lease:
    lease_id: int
    kind: str                # KIND_URL or KIND_ROBOTS
    host_key: str
    url: str                 # for robots: host_key + "/robots.txt"
    item: QueuedURL | None   # None for robots leases
    deadline: float          # clock time after which expire_leases() takes it back
    attempt: int             # 1 for a first try, n for the n-th
    ip: str = ""             # address the host resolved to (connect here: no re-resolution)


# -- queue key: host id | level | seq ---------------------------------------
# One B-tree range per (host, level) keeps each back queue FIFO by seq and lets
# a lease read the head with one set_range.
_QKEY = struct.Struct(">IBQ")
QKEY_SIZE = _QKEY.size
_QPREFIX = struct.Struct(">IB")
_HPREFIX = struct.Struct(">I")


def qkey(hid: int, level: int, seq: int) -> bytes:
    return _QKEY.pack(hid, level, seq)


def qprefix(hid: int, level: int) -> bytes:
    return _QPREFIX.pack(hid, level)


def hprefix(hid: int) -> bytes:
    return _HPREFIX.pack(hid)


def qkey_level(key: bytes) -> int:
    return key[4]


# -- URL record: fp, depth, hops, attempts, then the URL as UTF-8 -------------
_UREC = struct.Struct("<QHHB")
_U16_MAX = 0xFFFF


def encode_url(item: QueuedURL) -> bytes:
    return _UREC.pack(item.fp & 0xFFFFFFFFFFFFFFFF, min(item.depth, _U16_MAX), min(item.hops, _U16_MAX),
                      min(item.attempts, 255)) + item.url.encode("utf-8", "surrogateescape")


def decode_url(raw: bytes, host_key: str, level: int) -> QueuedURL:
    fp, depth, hops, attempts = _UREC.unpack_from(raw)
    return QueuedURL(raw[_UREC.size:].decode("utf-8", "surrogateescape"), host_key, level, depth, hops, fp,
                     attempts)


def with_attempts(raw: bytes, attempts: int) -> bytes:
    fp, depth, hops, _ = _UREC.unpack_from(raw)
    return _UREC.pack(fp, depth, hops, min(attempts, 255)) + raw[_UREC.size:]


def attempts_of(raw: bytes) -> int:
    return raw[_UREC.size - 1]


# -- tagged record (leases, dead letters, dropped events) ---------------------
# tag (reason or outcome) | host key | queue key | URL record.
_TAGGED = struct.Struct("<HH")


def encode_tagged(tag: str, host_key: str, key: bytes, urec: bytes) -> bytes:
    t = tag.encode()
    h = host_key.encode("utf-8", "surrogateescape")
    return _TAGGED.pack(len(t), len(h)) + t + h + key + urec


def decode_tagged(raw: bytes) -> tuple[str, str, bytes, bytes]:
    """Return (tag, host_key, queue key, URL record)."""
    nt, nh = _TAGGED.unpack_from(raw)
    p = _TAGGED.size
    tag = raw[p:p + nt].decode()
    p += nt
    host_key = raw[p:p + nh].decode("utf-8", "surrogateescape")
    p += nh
    return tag, host_key, raw[p:p + QKEY_SIZE], raw[p + QKEY_SIZE:]
