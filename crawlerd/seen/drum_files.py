"""DRUM's files on disk: names, headers, journal blocks, results, cursor, manifest, torn tails.

Files under a DRUM directory (``<data_dir>/drum/``), all little-endian:

* ``MANIFEST``: JSON commit record: key file generation, its count and
  checksum, the last merged epoch. Rewritten to a temp name, fsynced, renamed.
* ``keys.<gen>``: 64-byte header (``DRUMKEY1``, version, value_size, count,
  checksum, gen), then ``count`` records ``key u64 | value``, strictly
  increasing by key. Its size must be 64 + count * (8 + value_size); the
  checksum and the order are verified by every merge as it reads the file.
* ``journal.<epoch>``: every accepted call since the last merge, one block
  per call: 40-byte header (magic, op, flags, value_size, n, aux bytes,
  first seq, payload length, checksum), then keys, cache-hit flags, cached
  values, submitted values, aux lengths, aux bytes, padded to 8 bytes.
* ``bucket.<b>``: spilled bucket records ``key | op<<62 | ordinal | value``
  of the open epoch (rebuilt from the journal on open, so never trusted).
* ``results.<epoch>``: a merged epoch's answers per ordinal (unique flag,
  stored value), kept with its journal until every result was handed out.
* ``cursor``: (epoch, seq) of the first result not yet acknowledged.

The journal writer, bucket spills and the merge pass are native
(``crawlerd/_native/drum.pyx``); this module reads and checks what they wrote
and writes the small commit files. The store (``drum.py``) decides when.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

KEY_MAGIC = b"DRUMKEY1"
RES_MAGIC = b"DRUMRES1"
HEADER_BYTES = 64
BLOCK_HEADER = 40
BLOCK_MAGIC = 0x4D555244
FORMAT = 1
M64 = (1 << 64) - 1
KEY_HEAD = struct.Struct("<8sIIQQQ")         # magic, version, value_size, count, checksum, gen
RES_HEAD = struct.Struct("<8sQQQQ")          # magic, epoch, ordinals, value_size, checksum
BLOCK = struct.Struct("<IBBHIIQQQ")          # magic, op, flags, V, n, aux bytes, first seq, payload, checksum
CURSOR = struct.Struct("<QQQ")               # epoch, seq, checksum
FILE_NAME = re.compile(r"^(keys|journal|results)\.(\d{12})(\.tmp)?$")


class DrumError(Exception):
    """DRUM cannot be used (directory locked, parameters do not match the files)."""


class DrumCorrupt(DrumError):
    """A DRUM file is damaged: wrong size, bad checksum, out of order, torn in the middle."""


class TornBlock(Exception):
    """A journal block that does not parse: [off, end) is what it would have covered."""

    def __init__(self, off: int, end: int):
        super().__init__(off)
        self.off = off
        self.end = end


@dataclass(slots=True)
class JournalBlock:
    """One decoded journal block, with its answers once its epoch is merged."""
    op: int
    first_seq: int
    keys: np.ndarray
    hit: np.ndarray
    hitvals: np.ndarray | None
    values: np.ndarray | None
    aux_lens: np.ndarray | None
    aux: bytes
    end: int                 # journal offset just past the block


@dataclass(slots=True)
class Manifest:
    """The commit record: which key file holds the merged keys, and where sequence numbers stand."""
    keys_gen: int
    count: int
    hash: int
    merged_epoch: int
    next_seq: int


def write_atomic(path: str, *parts) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for data in parts:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pad8(n: int) -> int:
    return (n + 7) & ~7


def block_bytes(n: int, value_size: int, with_values: bool, aux_bytes: int | None) -> int:
    """Bytes one journal block of ``n`` keys takes (header and padded payload)."""
    V = value_size
    return BLOCK_HEADER + pad8(n * (9 + V) + (n * V if with_values else 0)
                               + (n * 4 + aux_bytes if aux_bytes is not None else 0))


def zeros_from(path: str, off: int) -> bool:
    # A tail of zeros: the file grew but the data never reached the disk (power loss).
    with open(path, "rb") as f:
        f.seek(off)
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return True
            if chunk.count(0) != len(chunk):
                return False


class DrumFiles:
    """Reads and checks the files of one DRUM directory for one value size.

    ``hash_words`` is the kernel's checksum (native or reference), the one
    the journal writer and the merge pass use.
    """

    def __init__(self, path: str, value_size: int, hash_words: Callable[..., int]):
        self.path = path
        self.value_size = value_size
        self.hash_words = hash_words

    def name(self, kind: str, n: int) -> str:
        return os.path.join(self.path, f"{kind}.{n:012d}")

    # -- journal ----------------------------------------------------------------------------------

    def parse_block(self, f, off: int, size: int) -> JournalBlock | None:
        """Next journal block at ``off`` of an open file; None at a clean end.

        Raises TornBlock for a bad block; the caller decides whether it is a torn tail.
        """
        if off >= size:
            return None
        head = f.read(BLOCK_HEADER)
        if len(head) < BLOCK_HEADER:
            raise TornBlock(off, size)
        magic, op, flags, V, n, auxb, first_seq, plen, h = BLOCK.unpack(head)
        if magic != BLOCK_MAGIC or op > 2 or V != self.value_size or plen % 8 or flags > 3:
            raise TornBlock(off, size)
        want = n * (9 + V) + (n * V if flags & 1 else 0) + (n * 4 + auxb if flags & 2 else 0)
        if pad8(want) != plen:
            raise TornBlock(off, off + BLOCK_HEADER + plen)
        payload = f.read(plen)
        if len(payload) < plen:
            raise TornBlock(off, off + BLOCK_HEADER + plen)
        if (self.hash_words(head[:32]) + self.hash_words(payload, 4)) & M64 != h:
            raise TornBlock(off, off + BLOCK_HEADER + plen)
        a = np.frombuffer(payload, np.uint8)
        p = n * 8
        keys = a[:p].view("<u8")
        hit = a[p:p + n]
        p += n
        hitvals = a[p:p + n * V] if V else None
        p += n * V
        values = None
        if flags & 1:
            values = a[p:p + n * V]
            p += n * V
        aux_lens, aux = None, b""
        if flags & 2:
            aux_lens = a[p:p + 4 * n].view("<u4")
            p += 4 * n
            aux = payload[p:p + auxb]
        return JournalBlock(op, first_seq, keys, hit, hitvals, values, aux_lens, aux, off + BLOCK_HEADER + plen)

    def journal_span(self, e: int) -> tuple[int, int]:
        """First and end seq of a merged epoch's journal (verifies every block)."""
        path = self.name("journal", e)
        first = end = None
        size = os.path.getsize(path)
        with open(path, "rb", buffering=1 << 20) as f:
            off = 0
            while True:
                try:
                    blk = self.parse_block(f, off, size)
                except TornBlock as t:
                    raise DrumCorrupt(f"{path}: bad journal block at offset {t.off}") from None
                if blk is None:
                    break
                if first is None:
                    first = blk.first_seq
                elif blk.first_seq != end:
                    raise DrumCorrupt(f"{path}: sequence gap at offset {off}")
                end = blk.first_seq + len(blk.keys)
                off = blk.end
        if first is None:
            raise DrumCorrupt(f"{path}: merged epoch with an empty journal")
        return first, end

    def open_journal_blocks(self, e: int, first_seq: int) -> Iterator[JournalBlock]:
        """The blocks of the open epoch's journal, in order, starting at ``first_seq``.

        A torn last block (a call that never returned) or a tail of zeros (a
        power loss) is cut off the file; a bad block before the end is
        ``DrumCorrupt``, never read as data.
        """
        path = self.name("journal", e)
        size = os.path.getsize(path)
        if size == 0:
            return
        off = 0
        want = first_seq
        with open(path, "rb", buffering=1 << 20) as f:
            while True:
                try:
                    blk = self.parse_block(f, off, size)
                except TornBlock as t:
                    if t.end >= size or zeros_from(path, t.off):
                        log.warning("drum journal %s: torn tail at offset %d cut off (a call that never "
                                    "returned)", path, t.off)
                        os.truncate(path, t.off)
                        return
                    raise DrumCorrupt(f"{path}: bad journal block at offset {t.off}") from None
                if blk is None:
                    return
                if blk.first_seq != want:
                    if off == 0:
                        raise DrumCorrupt(f"{path}: starts at seq {blk.first_seq}, the last merge ended at "
                                          f"{want}")
                    raise DrumCorrupt(f"{path}: sequence gap at offset {off}")
                want = blk.first_seq + len(blk.keys)
                off = blk.end
                yield blk

    # -- results, key file, cursor, manifest ------------------------------------------------------

    def write_results(self, e: int, body: np.ndarray) -> None:
        """``results.<e>``: the epoch's P answers, unique flags then values (``body`` is P * (1 + V) bytes)."""
        P = len(body) // (1 + self.value_size)
        write_atomic(self.name("results", e),
                     RES_HEAD.pack(RES_MAGIC, e, P, self.value_size, self.hash_words(body))
                     .ljust(HEADER_BYTES, b"\0"), body)

    def load_results(self, path: str, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(unique flags, values) of a merged epoch, checked against its header and checksum."""
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            body = f.read()
        V = self.value_size
        if len(head) < HEADER_BYTES:
            raise DrumCorrupt(f"{path}: truncated header")
        magic, e, P, v, h = RES_HEAD.unpack_from(head)
        if magic != RES_MAGIC or e != epoch or v != V or len(body) != P * (1 + V):
            raise DrumCorrupt(f"{path}: bad header or size ({len(body)} bytes for {P} answers)")
        if self.hash_words(body) != h:
            raise DrumCorrupt(f"{path}: checksum mismatch")
        arr = np.frombuffer(body, np.uint8)
        return arr[:P], arr[P:]

    def key_header(self, count: int, khash: int, gen: int) -> bytes:
        return KEY_HEAD.pack(KEY_MAGIC, FORMAT, self.value_size, count, khash, gen).ljust(HEADER_BYTES, b"\0")

    def check_key_file(self, gen: int, count: int, khash: int) -> None:
        """The key file MANIFEST names exists, has its size and a header that agrees."""
        path = self.name("keys", gen)
        want = HEADER_BYTES + count * (8 + self.value_size)
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
        except FileNotFoundError:
            raise DrumCorrupt(f"{path}: key file named by MANIFEST is missing") from None
        if size != want:
            raise DrumCorrupt(f"{path}: {size} bytes, expected {want} for {count} keys")
        magic, version, v, c, h, g = KEY_HEAD.unpack_from(head)
        if magic != KEY_MAGIC or version != FORMAT or v != self.value_size or c != count or h != khash \
                or g != gen:
            raise DrumCorrupt(f"{path}: header does not match MANIFEST")

    def read_cursor(self, fd: int) -> tuple[int, int]:
        data = os.pread(fd, CURSOR.size, 0)
        if len(data) < CURSOR.size:
            return (0, 0)
        e, s, h = CURSOR.unpack(data)
        if self.hash_words(struct.pack("<QQ", e, s)) != h:
            log.warning("drum cursor %s unreadable; results since the last merge are delivered again",
                        self.path)
            return (0, 0)
        return (e, s)

    def write_cursor(self, fd: int, e: int, s: int) -> None:
        os.pwrite(fd, CURSOR.pack(e, s, self.hash_words(struct.pack("<QQ", e, s))), 0)

    def read_manifest(self) -> Manifest | None:
        """The MANIFEST, None when there is none; a bad one or another format/value size is an error."""
        mpath = os.path.join(self.path, "MANIFEST")
        if not os.path.exists(mpath):
            return None
        try:
            with open(mpath, "rb") as f:
                doc = json.loads(f.read())
            m = Manifest(doc["keys_gen"], doc["count"], doc["hash"], doc["merged_epoch"], doc["next_seq"])
            fmt, mv = doc["format"], doc["value_size"]
        except (ValueError, KeyError, TypeError) as e:
            raise DrumCorrupt(f"{mpath}: unreadable manifest ({e})") from None
        if fmt != FORMAT:
            raise DrumError(f"{mpath}: format {fmt}, this build reads {FORMAT}")
        if mv != self.value_size:
            raise DrumError(f"{self.path} holds value_size {mv}, opened with {self.value_size}")
        return m

    def write_manifest(self, m: Manifest) -> None:
        doc = {"format": FORMAT, "value_size": self.value_size, "keys_gen": m.keys_gen, "count": m.count,
               "hash": m.hash, "merged_epoch": m.merged_epoch, "next_seq": m.next_seq}
        write_atomic(os.path.join(self.path, "MANIFEST"), json.dumps(doc).encode() + b"\n")
