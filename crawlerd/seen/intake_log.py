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

With a writer thread (``IntakeWriter.thread``, set once the seen-set runs on a
loop) the loop only builds a record and hands it over: the thread opens,
appends to, closes and deletes the segments, in the order they were handed
over (a segment is deleted only after its last record was written), the
records of one group that go to one segment in one ``writev``. A
record's ``then`` runs on the loop once it is written: only then may anything
that depends on the keys being kept (a lease's completion, a hand-off
acknowledgement) happen.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator

import numpy as np

from crawlerd.seen.drum_files import DrumCorrupt
from crawlerd.store.fsync import write_all
from crawlerd.store.writer import WriterError, WriteThread

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

    Invariant: at most one segment is open (``segment``, ``is_open``); segment
    numbers only grow, past every segment found at open (``last_segment``).
    With ``thread`` set, the file operations run on it in the order called
    (``_tfd``, ``_tno``: the file it has open) and the caller's ``fd`` stays -1.
    """

    def __init__(self, path: str, last_segment: int):
        self.path = path
        self.segment_no = last_segment
        self.segment: str | None = None
        self.is_open = False
        self.fd = -1
        self.thread: WriteThread | None = None
        self._tfd = -1
        self._tno = -1

    def attach(self, thread: WriteThread) -> None:
        """Write on ``thread`` from now on; a segment open here is continued there (its file
        handed over before the thread is given anything)."""
        if self.fd >= 0:
            self._tfd, self._tno = self.fd, self.segment_no
            self.fd = -1
        self.thread = thread

    def append(self, first_seq: int, karr: np.ndarray, aux: list[bytes] | None,
               then: Callable[[], None] | None = None, lens: np.ndarray | None = None) -> int:
        """One record; without a thread it is written when this returns, with one ``then`` runs
        on the loop once it is. ``lens``: the aux records' lengths when the caller has them.
        Returns the record's aux bytes."""
        if not self.is_open:
            self.segment_no += 1
            self.segment = segment_path(self.path, self.segment_no)
            self.is_open = True
            if self.thread is None:
                self.fd = _open_segment(self.segment)
        n = len(karr)
        parts = [karr.astype("<u8", copy=False).tobytes()]
        flags = auxb = 0
        if aux is not None:
            flags = AUX
            parts.append((np.fromiter(map(len, aux), dtype="<u4", count=n) if lens is None
                          else lens.astype("<u4", copy=False)).tobytes())
            parts.append(b"".join(aux))
            auxb = len(parts[-1])
        crc = _crc(RECORD.pack(RECORD_MAGIC, flags, n, auxb, first_seq, 0, 0), parts)
        parts.insert(0, RECORD.pack(RECORD_MAGIC, flags, n, auxb, first_seq, crc, 0))
        if self.thread is None:
            write_all(self.fd, parts)
        else:
            self.thread.submit(self._run_ops, ("append", self.segment_no, parts), then)
        return auxb

    def take_segment(self) -> str | None:
        """Close the open segment and return its path (None if none); the next append starts a new one."""
        seg = self.segment if self.is_open else None
        self.close()
        self.segment = None
        return seg

    def close(self) -> None:
        """Close the open segment's file, keeping it (its records are replayed at the next start)."""
        if self.is_open and self.thread is not None:
            try:
                self.thread.submit(self._run_ops, ("close", self.segment_no, None))
            except WriterError:
                pass                # the thread stopped on a failed write: nothing more is written
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.is_open = False

    def unlink(self, segment: str) -> None:
        """Delete a segment whose records DRUM journalled (from any thread): with a writer thread,
        after the records handed to it before this call."""
        if self.thread is None:
            os.unlink(segment)
        else:
            self.thread.submit(self._run_ops, ("unlink", segment, None))

    def _run_ops(self, ops: list[tuple[str, object, object]]) -> None:
        # on the writer thread, in the order handed over; a run of appends to one segment is one
        # write_all (a group holds a record per submit: one system call for them, not one each)
        run: list[bytes] = []
        for op, a, parts in ops:
            if op == "append":
                if self._tno != a:
                    self._write_run(run)
                    self._close_thread_fd()
                    self._tfd = _open_segment(segment_path(self.path, a))
                    self._tno = a
                run += parts
                continue
            self._write_run(run)
            if op == "close":
                if self._tno == a:
                    self._close_thread_fd()
            else:
                os.unlink(a)
        self._write_run(run)

    def _write_run(self, run: list[bytes]) -> None:
        if run:
            write_all(self._tfd, run)
            run.clear()

    def _close_thread_fd(self) -> None:
        if self._tfd >= 0:
            os.close(self._tfd)
        self._tfd, self._tno = -1, -1


def _open_segment(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)


def _crc(head: bytes, parts: list[bytes]) -> int:
    c = zlib.crc32(head)
    for p in parts:
        c = zlib.crc32(p, c)
    return c


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


def replay_intake(drum, path: str, calls: Callable) -> int:
    """Submit to ``drum`` the records of the intake log under ``path`` it has not journalled (a crash
    between ``submit`` and the DRUM thread's hand-over), in ``calls`` (``drum_calls``) of bounded size,
    make them durable, and delete the segments. Returns the highest segment number there was (0: none)."""
    segs = segments(path)
    replayed = 0
    for s in segs:
        seg = segment_path(path, s)
        for first, keys, aux in read_intake(seg):
            skip = drum.next_seq - first
            if skip < 0:
                raise DrumCorrupt(f"{seg}: intake starts at seq {first}, DRUM ends at {drum.next_seq}")
            if skip >= len(keys):
                continue
            rest = (keys[skip:], None if aux is None else aux[skip:])
            for k, a in calls([rest]):
                drum.check_update(k, aux=a)
            replayed += len(keys) - skip
    if replayed:
        drum.sync()
        log.warning("seen-set %s: %d submitted keys replayed from the intake log", path, replayed)
    for s in segs:
        os.unlink(segment_path(path, s))
    return max(segs, default=0)
