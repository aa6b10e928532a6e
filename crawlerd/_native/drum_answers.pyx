"""The answer side of the DRUM kernel (re-exported by ``drum.pyx``): the answer object handed out
and the decoder that turns journal blocks plus a merge's answers into answer arrays.

``Result`` is one answer (``crawlerd.seen.drum_answers.DrumResult``). ``decode_blocks`` is the
dispatch fast path of ``crawlerd/seen/drum_answers.py``; ``make_results`` makes a delivery's answers
into ``Result`` objects when its consumer reads them. References: ``drum_ref.Result``,
``drum_ref.decode_blocks`` and ``drum_ref.make_results``; the journal block format is in
``crawlerd/seen/drum_files.py``.
"""

cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from crawlerd._native.drum_io cimport BLOCK_HEADER, BLOCK_MAGIC, _hash_words


@cython.no_gc
@cython.final
cdef class Result:
    """One answer handed out (``crawlerd.seen.drum_answers.DrumResult``); reference: ``drum_ref.Result``.

    Not tracked by the cyclic collector: its fields are ints, bytes, None and an ``Op`` member, so
    it is in no reference cycle. A delivery of up to 8,192 answers outlives several loop
    iterations, and as tracked objects they were the largest share of the crawl loop's young and
    middle generations (walked at each pass while alive); untracked, no pass walks them.
    """
    cdef readonly object key
    cdef readonly object op
    cdef readonly bint unique
    cdef readonly object value
    cdef readonly object aux
    cdef readonly object seq

    def __init__(self, key, op, unique, value, aux, seq):
        self.key = key
        self.op = op
        self.unique = unique
        self.value = value
        self.aux = aux
        self.seq = seq

    def _fields(self):
        return (self.key, self.op, self.unique, self.value, self.aux, self.seq)

    def __eq__(self, other):
        if not isinstance(other, Result):
            return NotImplemented
        return self._fields() == (<Result>other)._fields()

    __hash__ = None

    def __repr__(self):
        return (f"DrumResult(key={self.key!r}, op={self.op!r}, unique={self.unique!r}, value={self.value!r}, "
                f"aux={self.aux!r}, seq={self.seq!r})")

    def __reduce__(self):
        return Result, self._fields()


def make_results(const uint64_t[::1] keys not None, const uint8_t[::1] unique not None, object op, uint64_t seq,
                 Py_ssize_t i0, Py_ssize_t i1, const uint8_t[::1] aux, const int64_t[::1] ends,
                 const uint8_t[::1] values, Py_ssize_t value_size):
    """Answers ``i0`` to ``i1 - 1`` of one run of a delivery (one journal block's answers: ``keys``,
    ``unique`` flags, the run's first ``seq`` and ``op``) as a list of ``Result``.

    ``aux``: the run's aux bytes one after another, ``ends[i]`` the offset just past answer i's
    (both None: submitted without aux); ``values``: ``value_size`` bytes per answer, given to
    the duplicates (None when ``value_size`` is 0). Every answer read from a delivery is made here
    (a slice of up to ``SEEN_SLICE`` per loop iteration, duplicates included): one call instead of
    a Python loop making each answer's key, aux slice and object.
    """
    cdef Py_ssize_t j, V = value_size
    cdef int64_t prev = 0, end
    cdef list out = []
    cdef Result r
    if i0 < 0 or i1 > keys.shape[0] or i1 > unique.shape[0]:
        raise IndexError("answers out of range")
    if (ends is None) != (aux is None):
        raise ValueError("aux and ends go together")
    if ends is not None:
        if i1 > ends.shape[0]:
            raise IndexError("answers out of range")
        if i0 > 0:
            prev = ends[i0 - 1]
    if V and (values is None or values.shape[0] < i1 * V):
        raise ValueError("values too short")
    for j in range(i0, i1):
        r = Result.__new__(Result)
        r.key = keys[j]
        r.op = op
        r.unique = unique[j] != 0
        r.value = None
        if V and not r.unique:
            r.value = PyBytes_FromStringAndSize(<const char *>&values[j * V], V)
        if ends is None:
            r.aux = None
        else:
            end = ends[j]
            if end < prev or end > aux.shape[0]:
                raise ValueError("aux ends out of order")
            r.aux = PyBytes_FromStringAndSize(<const char *>&aux[prev], end - prev) if end > prev else b""
            prev = end
        r.seq = seq + <uint64_t>j
        out.append(r)
    return out


def decode_blocks(const uint8_t[::1] buf not None, Py_ssize_t value_size, const uint8_t[::1] unique_in not None,
                  const uint8_t[::1] values_in not None, uint64_t ordinal, uint64_t seq,
                  uint64_t[::1] keys_out not None, uint8_t[::1] unique_out not None,
                  uint8_t[::1] values_out not None, Py_ssize_t out_pos):
    """Answer whole journal blocks from ``buf`` into the output arrays (the dispatch fast path).

    Each block is checked (magic, value size, length, checksum, ``first_seq ==
    seq``); its cache hits are duplicates with their cached value, the others
    take the next ordinal's answer from ``unique_in`` / ``values_in``. Stops at
    the end of ``buf``, before a block that is not complete in it, or before one
    that does not fit the output (possibly the first: then nothing is consumed). Returns (bytes consumed, keys written,
    ordinals used); raises ValueError for a bad block.
    """
    cdef size_t off = 0, size = buf.shape[0], plen, n, i, V = value_size, want, aux_b
    cdef Py_ssize_t cap = keys_out.shape[0], pos = out_pos
    cdef const uint8_t* b
    cdef const uint8_t* kp
    cdef const uint8_t* hp
    cdef const uint8_t* hv
    cdef uint64_t o = ordinal, h, s = seq
    cdef uint8_t flags
    if <size_t>values_out.shape[0] < <size_t>cap * V:
        raise ValueError("values_out too small")
    while off + BLOCK_HEADER <= size:
        b = &buf[0] + off
        n = (<const uint32_t*>(b + 8))[0]
        plen = (<const uint64_t*>(b + 24))[0]
        flags = b[5]
        aux_b = (<const uint32_t*>(b + 12))[0]
        if ((<const uint32_t*>b)[0] != BLOCK_MAGIC or b[4] > 2 or flags > 3
                or (<const uint16_t*>(b + 6))[0] != V):
            raise ValueError(f"bad journal block header at offset {off}")
        want = n * (9 + V) + (n * V if flags & 1 else 0) + (n * 4 + aux_b if flags & 2 else 0)
        if ((want + 7) & ~<size_t>7) != plen:
            raise ValueError(f"bad journal block length at offset {off}")
        if off + BLOCK_HEADER + plen > size:
            break
        if pos + <Py_ssize_t>n > cap:
            break
        h = _hash_words(b, 32, 0) + _hash_words(b + BLOCK_HEADER, plen, 4)
        if h != (<const uint64_t*>(b + 32))[0]:
            raise ValueError(f"journal block checksum mismatch at offset {off}")
        if (<const uint64_t*>(b + 16))[0] != s:
            raise ValueError(f"journal block at offset {off} starts at seq "
                             f"{(<const uint64_t*>(b + 16))[0]}, expected {s}")
        kp = b + BLOCK_HEADER
        hp = kp + n * 8
        hv = hp + n
        memcpy(&keys_out[pos], kp, n * 8)
        for i in range(n):
            if hp[i]:
                unique_out[pos + i] = 0
                if V:
                    memcpy(&values_out[(pos + i) * V], hv + i * V, V)
            else:
                if o >= <uint64_t>unique_in.shape[0]:
                    raise ValueError("fewer answers than journalled keys")
                unique_out[pos + i] = unique_in[o]
                if V:
                    memcpy(&values_out[(pos + i) * V], &values_in[o * V], V)
                o += 1
        pos += n
        s += n
        off += BLOCK_HEADER + plen
    return off, pos - out_pos, o - ordinal
