"""DRUM's answers: handing out merged epochs' results in submission order, acknowledged by a cursor.

A merged epoch keeps its journal (the calls, with their keys and aux bytes)
and its ``results.<epoch>`` file (one answer per bucketed key); answers are
read back by walking both sequentially. Handing a result out does not make
it delivered: only ``ack`` moves the ``cursor`` file past it, and fully
acknowledged epochs' files are deleted then. A crash before the ack hands
the same results out again (same ``seq``, same answer): at-least-once.
"""

from __future__ import annotations

import bisect
import collections.abc
import enum
import os
from collections.abc import Sequence

import numpy as np

from crawlerd._native import drum as native_drum
from crawlerd.seen.drum_files import DrumCorrupt, DrumFiles, JournalBlock


class Op(enum.IntEnum):
    CHECK = 0
    UPDATE = 1
    CHECK_UPDATE = 2


# One answer: key; op (an ``Op``); unique (key absent just before this operation); value (stored
# just before it, None if absent or value_size 0); aux (the caller's aux bytes, as submitted); seq
# (global submission number, stable across restarts). The kernel's class (a ``Delivery`` makes
# them with ``kernels.make_results``): the native one is not tracked by the cyclic collector (a
# delivery of 8,192 outlives several loop iterations), ``drum_ref.Result`` is its plain reference.
DrumResult = native_drum.Result


class ReadyEpoch:
    """A merged epoch whose results are being handed out: journal + answers, read sequentially.

    Invariant: ``seq`` is the next result to hand out; ``ordinal`` counts the
    bucketed keys before it; ``pos`` is the offset of the block holding it.
    """

    __slots__ = ("epoch", "journal", "results", "seq", "end_seq", "ordinal", "pos", "offset_in_block",
                 "unique", "values", "block", "_f")

    def __init__(self, epoch: int, journal: str, results: str, first_seq: int, end_seq: int):
        self.epoch = epoch
        self.journal = journal
        self.results = results
        self.seq = first_seq
        self.end_seq = end_seq
        self.ordinal = 0
        self.pos = 0
        self.offset_in_block = 0
        self.unique: np.ndarray | None = None
        self.values: np.ndarray | None = None
        self.block: JournalBlock | None = None
        self._f = None

    def journal_file(self):
        """The journal, opened on first use (buffered, read sequentially)."""
        if self._f is None:
            self._f = open(self.journal, "rb", buffering=1 << 20)
        return self._f

    def fileno(self) -> int:
        return self.journal_file().fileno()

    def close(self) -> None:
        """Handed out entirely (or shutting down): its file and answers leave RAM."""
        if self._f is not None:
            self._f.close()
            self._f = None
        self.unique = self.values = None
        self.block = None


class _Part:
    """A run of one journal block's answers in a delivery: seq, op, keys, unique, values, aux."""

    __slots__ = ("seq", "op", "keys", "unique", "values", "aux", "ends")

    def __init__(self, seq: int, op: Op, keys: np.ndarray, unique: np.ndarray, values: np.ndarray | None,
                 aux: bytes | None, ends: np.ndarray | None):
        self.seq = seq
        self.op = op
        self.keys = keys
        self.unique = unique
        self.values = values
        self.aux = aux          # the run's aux bytes, one after another (None: submitted without aux)
        self.ends = ends        # offset just past each answer's aux in ``aux``


class Delivery(collections.abc.Sequence):
    """One delivery of DRUM answers, in seq order, kept as arrays; ``DrumResult`` objects are made
    when an index or a slice is read (a slice is a list of them).

    A consumer that judges a delivery a slice per loop iteration holds one slice's objects at a
    time, not the whole delivery's (8,192 answers: ~2.5 MiB of small objects, the swing of the
    crawl process's Python heap that set its arena count). Invariant: ``parts`` are consecutive in
    seq; ``len`` is the sum of their lengths.
    """

    __slots__ = ("_parts", "_starts", "_n", "_make", "_V")

    def __init__(self, parts: list[_Part], n: int, make, value_size: int):
        """``make``: the kernel's ``make_results`` (one call per run of answers read)."""
        self._parts = parts
        self._starts = np.cumsum([0] + [len(p.keys) for p in parts[:-1]], dtype=np.int64).tolist()
        self._n = n
        self._make = make
        self._V = value_size

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step != 1:
                return self[:][i]
            return self._make_range(start, stop)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("delivery index out of range")
        return self._make_range(i, i + 1)[0]

    def __iter__(self):
        step = 512
        for start in range(0, self._n, step):
            yield from self._make_range(start, min(self._n, start + step))

    def __eq__(self, other):
        if isinstance(other, (Delivery, list)):
            return self[:] == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"Delivery({self._n} answers)"

    def runs(self, start: int, stop: int) -> list[tuple]:
        """Answers ``start`` to ``stop - 1`` as arrays, no answer object made: one ``(keys, unique,
        seq, i0, i1, aux, ends)`` per run they span (``answer_runs``)."""
        out: list[tuple] = []
        if start >= stop:
            return out
        k = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            p, base = self._parts[k], self._starts[k]
            i0 = start - base
            i1 = min(len(p.keys), stop - base)
            out.append((p.keys, p.unique, p.seq, i0, i1, p.aux, p.ends))
            start += i1 - i0
            k += 1
        return out

    def _make_range(self, start: int, stop: int) -> list[DrumResult]:
        out: list[DrumResult] = []
        if start >= stop:
            return out
        make, V = self._make, self._V
        k = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            p, base = self._parts[k], self._starts[k]
            i0 = start - base
            i1 = min(len(p.keys), stop - base)
            out += make(p.keys, p.unique, p.op, p.seq, i0, i1, p.aux, p.ends, p.values, V)
            start += i1 - i0
            k += 1
        return out


def answer_runs(results: Sequence[DrumResult], start: int, stop: int) -> list[tuple]:
    """Answers ``start`` to ``stop - 1`` of a delivery as runs of arrays: ``(keys, unique, seq, i0,
    i1, aux, ends)``, answer j of a run (``i0`` <= j < ``i1``) having seq ``seq + j``, its aux
    ``aux[ends[j - 1]:ends[j]]`` (``ends[-1]`` read as 0; both None: submitted without aux). A
    ``Delivery`` hands its arrays over as they are; a list of answers (a test's) is packed into
    runs of consecutive seqs."""
    if isinstance(results, Delivery):
        return results.runs(start, min(stop, len(results)))
    out: list[tuple] = []
    group: list[DrumResult] = []
    for r in list(results[start:stop]) + [None]:
        if group and (r is None or r.seq != group[-1].seq + 1 or (r.aux is None) != (group[0].aux is None)):
            aux = ends = None
            if group[0].aux is not None:
                aux = b"".join(g.aux for g in group)
                ends = np.cumsum([len(g.aux) for g in group], dtype=np.int64)
            out.append((np.array([g.key for g in group], dtype=np.uint64),
                        np.array([g.unique for g in group], dtype=np.uint8), group[0].seq, 0, len(group), aux, ends))
            group = []
        if r is not None:
            group.append(r)
    return out


class AnswerQueue:
    """The merged epochs not yet fully acknowledged, oldest first.

    Key: seq. Invariant: ``ready`` holds consecutive epochs in order;
    ``handed_seq`` is the seq of the next result to hand out and ``handed``
    its (epoch, seq) position; ``acked`` is what the cursor file holds (``acked_seq``
    its seq), never past ``handed``; ``marks`` are the positions where the
    hand-outs not yet acknowledged ended (an ack may stop at one). ``done``
    epochs were handed out entirely and lose their files once acknowledged.
    """

    def __init__(self, files: DrumFiles, kernels, cursor_fd: int, ready: list[ReadyEpoch],
                 cursor: tuple[int, int], handed_seq: int):
        self.files = files
        self.value_size = files.value_size
        self.kern = kernels
        self.cursor_fd = cursor_fd
        self.ready = ready
        self.done: list[ReadyEpoch] = []
        self.handed_seq = self.acked_seq = handed_seq
        self.handed = self.acked = cursor
        self.marks: collections.deque[tuple[int, tuple[int, int]]] = collections.deque()

    def _mark(self) -> None:
        # where this hand-out ended: an ack may stop here (``ack(upto)``)
        if self.handed_seq > (self.marks[-1][0] if self.marks else self.acked_seq):
            self.marks.append((self.handed_seq, self.handed))

    def add(self, r: ReadyEpoch) -> None:
        """A freshly merged epoch (its answers already in ``r.unique``/``r.values``)."""
        self.ready.append(r)

    @property
    def available(self) -> int:
        """Results dispatched by merges and not yet handed out."""
        return sum(r.end_seq - r.seq for r in self.ready)

    def ram_bytes(self) -> int:
        """Bytes of answers held in RAM (the epochs' ``unique`` and ``values`` arrays loaded)."""
        return sum(a.nbytes for r in self.ready for a in (r.unique, r.values) if a is not None)

    def results(self, limit: int) -> list[DrumResult]:
        return self.delivery(limit)[:]

    def delivery(self, limit: int) -> Delivery:
        """The next answers, at most ``limit``, handed out as a ``Delivery`` (arrays, not objects)."""
        parts: list[_Part] = []
        got = 0
        V = self.value_size
        while got < limit:
            r = self.next_block()
            if r is None:
                break
            blk = r.block
            i0 = r.offset_in_block
            n = min(len(blk.keys) - i0, limit - got)
            unique, vals = self.answers(r, blk)
            aux = ends = None
            if blk.aux_lens is not None:
                all_ends = np.cumsum(blk.aux_lens, dtype=np.int64)
                a0 = int(all_ends[i0 - 1]) if i0 else 0
                ends = all_ends[i0:i0 + n] - a0
                aux = blk.aux[a0:a0 + int(ends[-1])] if n else b""
            parts.append(_Part(blk.first_seq + i0, Op(blk.op), blk.keys[i0:i0 + n].copy(),
                               unique[i0:i0 + n].copy(),
                               vals[i0 * V:(i0 + n) * V].copy() if V else None, aux, ends))
            got += n
            self.advance(r, n)
        self._mark()
        return Delivery(parts, got, self.kern.make_results, V)

    def results_arrays(self, limit: int):
        V = self.value_size
        avail = min(limit, self.available)
        keys = np.empty(avail, np.uint64)
        unique = np.empty(avail, np.uint8)
        values = np.empty(avail * V, np.uint8)
        first_seq = self.handed_seq
        got = 0
        while got < avail:
            r = self.next_block()
            if r is None:
                break
            blk = r.block
            if r.offset_in_block < len(blk.keys):
                # Rest of a block begun by results(), or one too big for the output or a read.
                n = min(len(blk.keys) - r.offset_in_block, avail - got)
                u, v = self.answers(r, blk)
                i0 = r.offset_in_block
                keys[got:got + n] = blk.keys[i0:i0 + n]
                unique[got:got + n] = u[i0:i0 + n]
                if V:
                    values[got * V:(got + n) * V] = v[i0 * V:(i0 + n) * V]
                got += n
                self.advance(r, n)
                if r.offset_in_block < len(blk.keys):
                    continue
            # Whole blocks from here on, decoded natively straight from the journal.
            r.pos = blk.end
            r.ordinal += int(len(blk.keys) - int(blk.hit.sum()))
            r.block = None
            while got < avail and r.seq < r.end_seq:
                chunk = os.pread(r.fileno(), 1 << 22, r.pos)
                try:
                    off, nk, nord = self.kern.decode_blocks(chunk, V, r.unique, r.values, r.ordinal, r.seq,
                                                            keys, unique, values, got)
                except ValueError as e:
                    raise DrumCorrupt(f"{r.journal}: {e}") from None
                if nk == 0:
                    break
                r.pos += off
                r.ordinal += nord
                got += nk
                r.seq += nk
                self.handed_seq += nk
                self.handed = (r.epoch, r.seq)
            if r.seq < r.end_seq and got < avail:
                r.block = self.read_block(r)
                r.offset_in_block = 0
        self._mark()
        return first_seq, keys[:got], unique[:got].view(bool), values[:got * V].reshape(got, V)

    def next_block(self) -> ReadyEpoch | None:
        """The ready epoch, positioned on the block holding the next result to hand out, or None."""
        while self.ready:
            r = self.ready[0]
            if r.seq >= r.end_seq:
                r.close()
                self.ready.pop(0)
                self.done.append(r)
                continue
            if r.unique is None:
                r.unique, r.values = self.files.load_results(r.results, r.epoch)
            if r.block is None or r.offset_in_block >= len(r.block.keys):
                if r.block is not None:
                    r.pos = r.block.end
                    r.ordinal += int(len(r.block.keys) - int(r.block.hit.sum()))
                r.block = self.read_block(r)
                r.offset_in_block = 0
                if r.block.first_seq > r.seq:
                    raise DrumCorrupt(f"{r.journal}: sequence gap at {r.seq}")
                if r.block.first_seq + len(r.block.keys) <= r.seq:
                    # A block entirely before the cursor (resuming after a restart).
                    r.offset_in_block = len(r.block.keys)
                    continue
                r.offset_in_block = r.seq - r.block.first_seq
            return r
        return None

    def read_block(self, r: ReadyEpoch) -> JournalBlock:
        f = r.journal_file()
        f.seek(r.pos)
        blk = self.files.parse_block(f, r.pos, os.fstat(f.fileno()).st_size)
        if blk is None:
            raise DrumCorrupt(f"{r.journal}: journal ends before result {r.seq}")
        return blk

    def answers(self, r: ReadyEpoch, blk: JournalBlock):
        """unique flags and values for every key of the block (cache hits answered as duplicates)."""
        V = self.value_size
        m = int(len(blk.keys) - int(blk.hit.sum()))
        if r.ordinal + m > len(r.unique):
            raise DrumCorrupt(f"{r.results}: fewer answers than journalled keys")
        if m == len(blk.keys):
            unique = r.unique[r.ordinal:r.ordinal + m]
            vals = r.values[r.ordinal * V:(r.ordinal + m) * V] if V else None
            return unique, vals
        miss = blk.hit == 0
        unique = np.zeros(len(blk.keys), np.uint8)
        unique[miss] = r.unique[r.ordinal:r.ordinal + m]
        vals = None
        if V:
            v2 = blk.hitvals.reshape(-1, V).copy()
            v2[miss] = r.values[r.ordinal * V:(r.ordinal + m) * V].reshape(-1, V)
            vals = v2.reshape(-1)
        return unique, vals

    def advance(self, r: ReadyEpoch, n: int) -> None:
        r.offset_in_block += n
        r.seq += n
        self.handed_seq += n
        self.handed = (r.epoch, r.seq)

    def ack(self, upto: int | None = None) -> None:
        """Persist the cursor past everything handed out so far, or only past the answers before seq
        ``upto`` (where one hand-out ended); drop the epochs acknowledged whole."""
        if upto is None or upto >= self.handed_seq:        # nothing past what was handed out
            upto, pos = self.handed_seq, self.handed
            self.marks.clear()
        else:
            pos = None
            while self.marks and self.marks[0][0] <= upto:
                seq, pos = self.marks.popleft()
            if pos is None or seq != upto:
                raise ValueError(f"ack({upto}): no hand-out ended there (acked {self.acked_seq}, "
                                 f"handed {self.handed_seq})")
        if pos == self.acked or upto <= self.acked_seq:
            return
        e, s = pos
        self.files.write_cursor(self.cursor_fd, e, s)
        self.acked, self.acked_seq = pos, upto
        while self.ready and self.ready[0].seq >= self.ready[0].end_seq:
            r = self.ready.pop(0)
            r.close()
            self.done.append(r)
        keep = []
        for r in self.done:
            if r.epoch > e or (r.epoch == e and s < r.end_seq):
                keep.append(r)          # handed out whole, not yet acknowledged whole
                continue
            for p in (r.journal, r.results):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        self.done = keep

    def close(self) -> None:
        for r in self.ready:
            r.close()
