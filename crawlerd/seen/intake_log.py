"""The seen-set's intake log: keys submitted but not yet handed to DRUM, on disk.

A key submitted to the ``AsyncSeenSet`` waits in RAM until the DRUM thread
takes it, and a merge can hold that thread for tens of seconds; so each
submit first appends one record here, one write into the page cache, which
survives ``kill -9`` as DRUM's journal does.

Segments ``intake.<n>`` (12 digits) in the DRUM directory, guarded by DRUM's
lock. A record is a header ``magic u32, flags u32, n u32, aux bytes u32, first
seq u64, crc32 u32, pad u32``, then keys u64, aux lengths u32, aux bytes (the
last two only with flag ``AUX``); the crc32 covers the header with crc 0 and
the body. A segment holds one batch: it is deleted once DRUM journalled that
batch. On open the records with seq at or past DRUM's ``next_seq`` are
replayed into DRUM; a torn last record (a submit that never returned, or a
tail that never reached the disk) is cut off.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Iterator

import numpy as np

from crawlerd.seen.drum_files import DrumCorrupt

log = logging.getLogger("crawlerd.seen")

SEGMENT_NAME = re.compile(r"^intake\.(\d{12})$")
RECORD = struct.Struct("<IIIIQII")   # magic, flags, n, aux bytes, first seq, crc32, pad
RECORD_MAGIC = 0x4B415449            # "ITAK"
AUX = 1                              # flags: aux lengths and bytes follow the keys


def segment_path(path: str, n: int) -> str:
    return os.path.join(path, f"intake.{n:012d}")


def segments(path: str) -> list[int]:
    """Numbers of the intake segments in a DRUM directory, oldest first."""
    return sorted(int(m.group(1)) for m in map(SEGMENT_NAME.match, os.listdir(path)) if m)


class IntakeWriter:
    """Appends one record per submit to the open segment of a DRUM directory.

    Invariant: at most one segment is open (``segment``, ``fd``); segment
    numbers only grow, past every segment found at open (``last_segment``).
    """

    def __init__(self, path: str, last_segment: int):
        self.path = path
        self.segment_no = last_segment
        self.segment: str | None = None
        self.fd = -1

    def append(self, first_seq: int, karr: np.ndarray, aux: list[bytes] | None) -> None:
        if self.fd < 0:
            self.segment_no += 1
            self.segment = segment_path(self.path, self.segment_no)
            self.fd = os.open(self.segment, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        n = len(karr)
        parts = [karr.astype("<u8", copy=False).tobytes()]
        flags = auxb = 0
        if aux is not None:
            flags = AUX
            parts.append(np.fromiter(map(len, aux), dtype="<u4", count=n).tobytes())
            parts.append(b"".join(aux))
            auxb = len(parts[-1])
        crc = _crc(RECORD.pack(RECORD_MAGIC, flags, n, auxb, first_seq, 0, 0), parts)
        parts.insert(0, RECORD.pack(RECORD_MAGIC, flags, n, auxb, first_seq, crc, 0))
        _write_all(self.fd, parts)

    def take_segment(self) -> str | None:
        """Close the open segment and return its path (None if none); the next append starts a new one."""
        seg = self.segment
        self.close()
        self.segment = None
        return seg

    def close(self) -> None:
        """Close the open segment's file, keeping it (its records are replayed at the next start)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _crc(head: bytes, parts: list[bytes]) -> int:
    c = zlib.crc32(head)
    for p in parts:
        c = zlib.crc32(p, c)
    return c


def _write_all(fd: int, parts: list[bytes]) -> None:
    views = [memoryview(p) for p in parts if p]
    while views:
        w = os.writev(fd, views)
        while views and w >= len(views[0]):
            w -= len(views[0])
            views.pop(0)
        if views and w:
            views[0] = views[0][w:]


def read_intake(path: str) -> Iterator[tuple[int, np.ndarray, list[bytes] | None]]:
    """Records of one intake segment: (first seq, keys, aux or None); stops at a torn tail."""
    with open(path, "rb") as f:
        data = f.read()
    off, size = 0, len(data)
    while off < size:
        torn = None
        if size - off < RECORD.size:
            torn = "short header"
        else:
            magic, flags, n, auxb, first, crc, _ = RECORD.unpack_from(data, off)
            end = off + RECORD.size + n * 8 + (n * 4 + auxb if flags & AUX else 0)
            if magic != RECORD_MAGIC or flags & ~AUX:
                torn = "bad header"
            elif end > size:
                torn = "short record"
            else:
                body = data[off + RECORD.size:end]
                if _crc(RECORD.pack(magic, flags, n, auxb, first, 0, 0), [body]) != crc:
                    torn = "checksum mismatch"
        if torn is not None:
            # A submit cut short by kill -9, or a tail that never reached the disk (zeros, garbage last record).
            short = torn in ("short header", "short record")
            if short or (torn == "checksum mismatch" and end == size) or data.count(0, off) == size - off:
                log.warning("seen-set intake %s: torn tail at offset %d cut off (%s)", path, off, torn)
                return
            raise DrumCorrupt(f"{path}: bad intake record at offset {off} ({torn})")
        body = memoryview(data)[off + RECORD.size:end]
        keys = np.frombuffer(body[:n * 8], dtype="<u8").astype(np.uint64)
        aux = None
        if flags & AUX:
            lens = np.frombuffer(body[n * 8:n * 12], dtype="<u4").tolist()
            blob = bytes(body[n * 12:])
            aux, p = [], 0
            for ln in lens:
                aux.append(blob[p:p + ln])
                p += ln
        yield first, keys, aux
        off = end
