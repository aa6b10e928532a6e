"""Block tables of the near-duplicate index: sorted runs of simhash fingerprints, queried within k bits.

Manku, Jain, Das Sarma (WWW 2007, §3): a 64-bit fingerprint split into four
16-bit blocks; any fingerprint within k <= 3 bits of a query agrees with it on
at least one block, so each of four tables sorted by a rotation of the
fingerprints finds the candidates of one block in one contiguous range.
``BlockTables`` is one immutable run, ``merge_tables`` merges two in linear
time, ``merge_into`` merges up to ``MAX_MERGE`` runs into caller-supplied
buffers (a writable map of a run file: ``crawlerd.dedup.near_index``), one
sequential pass per table with the GIL released, ``scan_into`` answers the
small unsorted tail. The arrays of a run may be numpy arrays in RAM or
read-only memory maps of run files. ``crawlerd.dedup.simhash_index``
builds the index from them (see there for the runs and their merging);
``blocktables_ref.py`` is the pure-Python reference with the same API and answers.
"""

from libc.stdint cimport int32_t, int64_t, uint64_t

import numpy as np

cdef extern from *:
    """
    #include <stdint.h>
    #include "bits.h"

    /* popcount(d) <= k for small k: clear the lowest set bit k times. */
    static inline int cd_within(uint64_t d, int k) {
        for (int j = 0; j < k; j++) d &= d - 1;
        return d == 0;
    }

    /* First index i in a[0:n] (sorted ascending) with a[i] >= key. */
    static inline Py_ssize_t cd_lower_bound(const uint64_t *a, Py_ssize_t n, uint64_t key) {
        Py_ssize_t lo = 0, hi = n;
        while (lo < hi) {
            Py_ssize_t mid = lo + ((hi - lo) >> 1);
            if (a[mid] < key) lo = mid + 1; else hi = mid;
        }
        return lo;
    }

    /* k-way merge of m sorted arrays (m <= 64) into out; among equal keys the
       lower input index comes first (older runs first), so the merge is stable.
       dsrc/dout (doc ids riding along) may be NULL. A linear scan of the m heads
       per output: m is the handful of runs merged at once. */
    static void cd_kmerge(int m, const uint64_t *const *src, const int64_t *const *dsrc,
                          const Py_ssize_t *len, uint64_t *out, int64_t *dout) {
        Py_ssize_t pos[64];
        Py_ssize_t o = 0;
        for (int i = 0; i < m; i++) pos[i] = 0;
        for (;;) {
            int best = -1;
            uint64_t bv = 0;
            for (int i = 0; i < m; i++) {
                if (pos[i] < len[i]) {
                    uint64_t v = src[i][pos[i]];
                    if (best < 0 || v < bv) { best = i; bv = v; }
                }
            }
            if (best < 0) break;
            out[o] = bv;
            if (dout) dout[o] = dsrc[best][pos[best]];
            o++;
            pos[best]++;
        }
    }
    """
    uint64_t cd_rotl64(uint64_t x, int r) nogil
    int cd_popcount64(uint64_t x) nogil
    int cd_within(uint64_t d, int k) nogil
    Py_ssize_t cd_lower_bound(const uint64_t *a, Py_ssize_t n, uint64_t key) nogil
    void cd_kmerge(int m, const uint64_t *const *src, const int64_t *const *dsrc,
                   const Py_ssize_t *len, uint64_t *out, int64_t *dout) nogil


cdef enum:
    _BLOCKS = 4
    _BUCKETS = 65536
# Runs at least this long get a bucket directory (65537 offsets per table, 2 MiB):
# one lookup instead of a binary search over a large, cold array.
OFFSETS_MIN = 1 << 17


def rotl_array(fps, int r):
    """rotl(fp, r) for every element of a uint64 array (r in 0..63)."""
    a = np.ascontiguousarray(fps, dtype=np.uint64)
    if r == 0:
        return a.copy()
    return (a << np.uint64(r)) | (a >> np.uint64(64 - r))


def _bucket_offsets(table):
    bounds = np.arange(_BUCKETS, dtype=np.uint64) << np.uint64(48)
    off = np.empty(_BUCKETS + 1, dtype=np.int64)
    off[:_BUCKETS] = np.searchsorted(table, bounds, side="left")
    off[_BUCKETS] = table.shape[0]
    return off


cdef int _check_k(int k) except -1:
    if k < 0 or k > 3:
        raise ValueError("k must be in 0..3")
    return 0


cdef int _check_outs(list outs, Py_ssize_t m) except -1:
    if len(outs) != m:
        raise ValueError("one output list per query")
    return 0


cdef class BlockTables:
    """One immutable sorted run of (fingerprint, doc id) pairs, four block tables.

    Key: table t (0..3) holds ``rotl(fp, 16 t)`` sorted ascending, so all
    fingerprints whose block t (bits 63-16t .. 48-16t) equals a query's block t
    lie in one contiguous range (Manku et al. §3: with 4 blocks and k <= 3, a
    fingerprint within k bits agrees with the query on at least one block).
    Table 0 is ``fps`` itself and ``doc_ids`` is aligned with it.
    Invariant: all five arrays have length n; each table is a permutation of
    the rotated fingerprints, sorted; ``offsets[t, b]`` (when present) is the
    first index in table t whose top 16 bits are >= b.
    """

    cdef readonly object fps
    cdef readonly object doc_ids
    cdef readonly object rot1
    cdef readonly object rot2
    cdef readonly object rot3
    cdef readonly object offsets
    cdef readonly Py_ssize_t n
    # Views keep the buffers pinned while the raw pointers below are in use.
    cdef const uint64_t[::1] _v0, _v1, _v2, _v3
    cdef const int64_t[::1] _vdoc
    cdef const int64_t[:, ::1] _voff
    cdef const uint64_t* _tab[_BLOCKS]
    cdef const int64_t* _doc
    cdef const int64_t* _off

    def __init__(self, fps, doc_ids, rot1, rot2, rot3, offsets=None):
        """Wrap already sorted arrays (see ``build`` and ``merge_tables``)."""
        arrays = [np.ascontiguousarray(x, dtype=np.uint64) for x in (fps, rot1, rot2, rot3)]
        docs = np.ascontiguousarray(doc_ids, dtype=np.int64)
        n = arrays[0].shape[0]
        if any(x.ndim != 1 or x.shape[0] != n for x in arrays) or docs.ndim != 1 or docs.shape[0] != n:
            raise ValueError("block tables must be 1-d arrays of one length")
        self.fps, self.rot1, self.rot2, self.rot3 = arrays
        self.doc_ids = docs
        self.n = n
        if offsets is None and n >= OFFSETS_MIN:
            offsets = np.stack([_bucket_offsets(x) for x in arrays])
        if offsets is not None:
            offsets = np.ascontiguousarray(offsets, dtype=np.int64)
            if offsets.shape != (_BLOCKS, _BUCKETS + 1):
                raise ValueError("bucket offsets must have shape (4, 65537)")
        self.offsets = offsets
        self._v0, self._v1, self._v2, self._v3 = arrays
        self._vdoc = docs
        self._tab[0] = self._tab[1] = self._tab[2] = self._tab[3] = NULL
        self._doc = NULL
        self._off = NULL
        if n > 0:
            self._tab[0] = &self._v0[0]
            self._tab[1] = &self._v1[0]
            self._tab[2] = &self._v2[0]
            self._tab[3] = &self._v3[0]
            self._doc = &self._vdoc[0]
        if offsets is not None:
            self._voff = offsets
            self._off = &self._voff[0, 0]

    @staticmethod
    def build(fps, doc_ids):
        """Sort unsorted (fingerprint, doc id) arrays into a run."""
        fps = np.ascontiguousarray(fps, dtype=np.uint64)
        doc_ids = np.ascontiguousarray(doc_ids, dtype=np.int64)
        if fps.shape != doc_ids.shape or fps.ndim != 1:
            raise ValueError("fps and doc_ids must be 1-d arrays of one length")
        order = np.argsort(fps, kind="stable")
        rots = [np.sort(rotl_array(fps, 16 * t)) for t in range(1, _BLOCKS)]
        return BlockTables(fps[order], doc_ids[order], *rots)

    def __len__(self):
        return self.n

    def check_invariant(self):
        """Verify sortedness, table contents and offsets (for tests); AssertionError if broken."""
        tables = [self.fps, self.rot1, self.rot2, self.rot3]
        base = np.sort(self.fps)
        for t, table in enumerate(tables):
            if self.n and not bool(np.all(table[1:] >= table[:self.n - 1])):
                raise AssertionError(f"table {t} not sorted")
            if not np.array_equal(np.sort(rotl_array(table, (64 - 16 * t) % 64)), base):
                raise AssertionError(f"table {t} does not hold the run's fingerprints")
            if self.offsets is not None and not np.array_equal(self.offsets[t], _bucket_offsets(table)):
                raise AssertionError(f"table {t} bucket offsets are stale")

    cdef inline void _bucket(self, int t, uint64_t key, Py_ssize_t* lo, Py_ssize_t* hi) noexcept:
        cdef const uint64_t* tab = self._tab[t]
        if self._off != NULL:
            lo[0] = self._off[t * (_BUCKETS + 1) + key]
            hi[0] = self._off[t * (_BUCKETS + 1) + key + 1]
            return
        lo[0] = cd_lower_bound(tab, self.n, key << 48)
        if key == _BUCKETS - 1:
            hi[0] = self.n
        else:
            hi[0] = lo[0] + cd_lower_bound(tab + lo[0], self.n - lo[0], (key + 1) << 48)

    cpdef int query_into(self, uint64_t q, int k, list out) except -1:
        """Append (doc_id, fp, distance) for every pair in the run within k bits of q; returns the count."""
        _check_k(k)
        return self._query(q, k, out)

    def query_many_into(self, const uint64_t[::1] qs, int k, list outs):
        """``query_into(qs[i], k, outs[i])`` for each i in one call (a batch's fingerprints: one
        Python call per run, not one per page); returns the total count."""
        cdef Py_ssize_t i, m = qs.shape[0]
        cdef int found = 0
        _check_k(k)
        _check_outs(outs, m)
        for i in range(m):
            found += self._query(qs[i], k, <list>outs[i])
        return found

    cdef int _query(self, uint64_t q, int k, list out) except -1:
        cdef int t, tt, dist
        cdef int found = 0
        cdef Py_ssize_t lo, hi, i, j
        cdef uint64_t qr, x, prev, fp, d
        cdef const uint64_t* tab
        cdef bint seen_before, have_prev
        if self.n == 0:
            return 0
        for t in range(_BLOCKS):
            tab = self._tab[t]
            qr = cd_rotl64(q, 16 * t)
            self._bucket(t, qr >> 48, &lo, &hi)
            have_prev = False
            prev = 0
            for i in range(lo, hi):
                x = tab[i]
                if not cd_within(x ^ qr, k):
                    continue
                # Equal fingerprints sit side by side; table 0 lists each pair, the
                # others report a fingerprint once and then expand it via table 0.
                if t > 0 and have_prev and x == prev:
                    continue
                have_prev = True
                prev = x
                fp = cd_rotl64(x, (64 - 16 * t) & 63)
                d = fp ^ q
                # Report a fingerprint only from the first table whose block matches.
                seen_before = False
                for tt in range(t):
                    if ((d >> (48 - 16 * tt)) & 0xFFFF) == 0:
                        seen_before = True
                        break
                if seen_before:
                    continue
                dist = cd_popcount64(d)
                if t == 0:
                    out.append((self._doc[i], fp, dist))
                    found += 1
                else:
                    j = cd_lower_bound(self._tab[0], self.n, fp)
                    while j < self.n and self._tab[0][j] == fp:
                        out.append((self._doc[j], fp, dist))
                        found += 1
                        j += 1
        return found


cdef class BlockTail:
    """The newest (fingerprint, doc id) pairs, unsorted, up to ``capacity``, with a hash chain per
    16-bit block so a query looks at the pairs sharing one of its blocks, not at all of them.

    Key: slot i (0 <= i < n) holds ``fps[i]``, ``doc_ids[i]`` in the order added. For each block t
    (0..3, bits 63-16t .. 48-16t as in the tables) the slots whose block t hashes to bucket b form
    one chain (``_head[t][b]``, then ``_next[t][i]``, newest first, -1 ends it). A fingerprint within
    k <= 3 bits of a query equals it on one block, so it is on that block's chain of the query; it
    is reported from the first such block only, once per pair, as ``scan_into`` would report it
    (in another order: callers sort).
    """

    cdef readonly object fps
    cdef readonly object doc_ids
    cdef readonly Py_ssize_t n
    cdef readonly Py_ssize_t capacity
    cdef object _heads, _nexts
    cdef uint64_t* _fp
    cdef int64_t* _doc
    cdef int32_t* _head
    cdef int32_t* _next
    cdef Py_ssize_t _nb

    def __init__(self, Py_ssize_t capacity):
        cdef uint64_t[::1] vf
        cdef int64_t[::1] vd
        cdef int32_t[::1] vh, vn
        if not 1 <= capacity <= (1 << 30):
            raise ValueError(f"capacity must be in 1..2**30, got {capacity}")
        nb = 1
        while nb * 2 <= capacity // 4 and nb < _BUCKETS:     # a chain of ~4 slots per bucket when full
            nb *= 2
        self._nb = nb
        self.capacity = capacity
        self.n = 0
        self.fps = np.zeros(capacity, dtype=np.uint64)
        self.doc_ids = np.zeros(capacity, dtype=np.int64)
        self._heads = np.full(_BLOCKS * nb, -1, dtype=np.int32)
        self._nexts = np.full(_BLOCKS * capacity, -1, dtype=np.int32)
        vf, vd, vh, vn = self.fps, self.doc_ids, self._heads, self._nexts
        self._fp, self._doc, self._head, self._next = &vf[0], &vd[0], &vh[0], &vn[0]

    @property
    def nbytes(self):
        """Bytes of its arrays: 32 per slot, 16 per bucket (at most 4 per slot)."""
        return self.fps.nbytes + self.doc_ids.nbytes + self._heads.nbytes + self._nexts.nbytes

    def __len__(self):
        return self.n

    cdef inline Py_ssize_t _slot(self, int t, uint64_t fp) noexcept:
        return t * self._nb + (((fp >> (48 - 16 * t)) & 0xFFFF) & (self._nb - 1))

    cpdef bint add(self, uint64_t fp, int64_t doc_id) except -1:
        """Append a pair; returns True when the tail is now full. ValueError if it was full."""
        cdef Py_ssize_t i = self.n, s
        cdef int t
        if i >= self.capacity:
            raise ValueError("the tail is full")
        self._fp[i] = fp
        self._doc[i] = doc_id
        for t in range(_BLOCKS):
            s = self._slot(t, fp)
            self._next[t * self.capacity + i] = self._head[s]
            self._head[s] = <int32_t>i
        self.n = i + 1
        return self.n == self.capacity

    def add_many(self, const uint64_t[::1] fps, const int64_t[::1] doc_ids):
        """Append pairs in order until the tail is full; returns how many were taken."""
        cdef Py_ssize_t i, take
        if fps.shape[0] != doc_ids.shape[0]:
            raise ValueError("fps and doc_ids must have one length")
        take = min(fps.shape[0], self.capacity - self.n)
        for i in range(take):
            self.add(fps[i], doc_ids[i])
        return take

    def clear(self):
        """Forget every pair (their chains too)."""
        cdef Py_ssize_t i
        cdef int t
        for i in range(self.n):
            for t in range(_BLOCKS):
                self._head[self._slot(t, self._fp[i])] = -1
        self.n = 0

    cdef int _query(self, uint64_t q, int k, list out) except -1:
        cdef int t, tt, found = 0
        cdef int32_t i
        cdef uint64_t d
        cdef bint seen_before
        for t in range(_BLOCKS):
            i = self._head[self._slot(t, q)]
            while i >= 0:
                d = self._fp[i] ^ q
                if ((d >> (48 - 16 * t)) & 0xFFFF) == 0 and cd_within(d, k):
                    seen_before = False         # reported from an earlier block's chain
                    for tt in range(t):
                        if ((d >> (48 - 16 * tt)) & 0xFFFF) == 0:
                            seen_before = True
                            break
                    if not seen_before:
                        out.append((self._doc[i], self._fp[i], cd_popcount64(d)))
                        found += 1
                i = self._next[t * self.capacity + i]
        return found

    cpdef int query_into(self, uint64_t q, int k, list out) except -1:
        """Append (doc_id, fp, distance) for every pair within k bits of q; returns the count."""
        _check_k(k)
        return self._query(q, k, out)

    def query_many_into(self, const uint64_t[::1] qs, int k, list outs):
        """``query_into(qs[i], k, outs[i])`` for each i in one call; returns the total count."""
        cdef Py_ssize_t i, m = qs.shape[0]
        cdef int found = 0
        _check_k(k)
        _check_outs(outs, m)
        for i in range(m):
            found += self._query(qs[i], k, <list>outs[i])
        return found


def scan_into(const uint64_t[::1] fps, const int64_t[::1] doc_ids, Py_ssize_t n, uint64_t q, int k,
              list out):
    """Append (doc_id, fp, distance) for each of the first n unsorted pairs within k bits of q."""
    cdef Py_ssize_t i
    cdef int found = 0
    _check_k(k)
    if n > fps.shape[0] or n > doc_ids.shape[0] or n < 0:
        raise ValueError("n exceeds the arrays")
    for i in range(n):
        if cd_within(fps[i] ^ q, k):
            out.append((doc_ids[i], fps[i], cd_popcount64(fps[i] ^ q)))
            found += 1
    return found


def scan_many_into(const uint64_t[::1] fps, const int64_t[::1] doc_ids, Py_ssize_t n,
                   const uint64_t[::1] qs, int k, list outs):
    """``scan_into`` for each query ``qs[j]`` into ``outs[j]``, in one pass over the n pairs (the
    pairs' order within each output, as ``scan_into``); returns the total count."""
    cdef Py_ssize_t i, j, m = qs.shape[0]
    cdef int found = 0
    cdef uint64_t x
    _check_k(k)
    if n > fps.shape[0] or n > doc_ids.shape[0] or n < 0:
        raise ValueError("n exceeds the arrays")
    _check_outs(outs, m)
    for i in range(n):
        x = fps[i]
        for j in range(m):
            if cd_within(x ^ qs[j], k):
                (<list>outs[j]).append((doc_ids[i], x, cd_popcount64(x ^ qs[j])))
                found += 1
    return found


cdef void _merge_u64(const uint64_t* a, Py_ssize_t na, const uint64_t* b, Py_ssize_t nb,
                     uint64_t* out) noexcept nogil:
    cdef Py_ssize_t i = 0, j = 0, o = 0
    while i < na and j < nb:
        if b[j] < a[i]:
            out[o] = b[j]
            j += 1
        else:
            out[o] = a[i]
            i += 1
        o += 1
    while i < na:
        out[o] = a[i]
        i += 1
        o += 1
    while j < nb:
        out[o] = b[j]
        j += 1
        o += 1


cdef void _merge_pairs(const uint64_t* a, const int64_t* ad, Py_ssize_t na,
                       const uint64_t* b, const int64_t* bd, Py_ssize_t nb,
                       uint64_t* out, int64_t* outd) noexcept nogil:
    cdef Py_ssize_t i = 0, j = 0, o = 0
    while i < na and j < nb:
        if b[j] < a[i]:
            out[o] = b[j]
            outd[o] = bd[j]
            j += 1
        else:
            out[o] = a[i]
            outd[o] = ad[i]
            i += 1
        o += 1
    while i < na:
        out[o] = a[i]
        outd[o] = ad[i]
        i += 1
        o += 1
    while j < nb:
        out[o] = b[j]
        outd[o] = bd[j]
        j += 1
        o += 1


def merge_tables(BlockTables a not None, BlockTables b not None):
    """Merge two runs into one in linear time (a's pairs first among equal fingerprints)."""
    cdef Py_ssize_t n = a.n + b.n
    if a.n == 0 or b.n == 0:
        return b if a.n == 0 else a
    fps = np.empty(n, dtype=np.uint64)
    docs = np.empty(n, dtype=np.int64)
    rots = [np.empty(n, dtype=np.uint64) for _ in range(_BLOCKS - 1)]
    cdef uint64_t[::1] out = fps
    cdef int64_t[::1] outd = docs
    cdef int t
    with nogil:
        _merge_pairs(a._tab[0], a._doc, a.n, b._tab[0], b._doc, b.n, &out[0], &outd[0])
    for t in range(1, _BLOCKS):
        out = rots[t - 1]
        with nogil:
            _merge_u64(a._tab[t], a.n, b._tab[t], b.n, &out[0])
    return BlockTables(fps, docs, *rots)


MAX_MERGE = 64


def merge_into(list runs not None, fps_out, docs_out, rot1_out, rot2_out, rot3_out):
    """Merge ``runs`` (BlockTables, oldest first) into the five writable output buffers.

    The outputs (1-d, length = the sum of the runs' lengths) receive table 0 with its
    doc ids and the three rotated tables, each in one sequential pass with the GIL
    released. Among equal fingerprints the older run's pairs come first. Returns the count.
    """
    cdef int m = len(runs), i, t
    cdef Py_ssize_t total = 0
    cdef const uint64_t* src[64]
    cdef const int64_t* dsrc[64]
    cdef Py_ssize_t lens[64]
    cdef BlockTables r
    if m < 1 or m > MAX_MERGE:
        raise ValueError(f"merge_into merges 1..{MAX_MERGE} runs, got {m}")
    for i in range(m):
        r = runs[i]
        total += r.n
    cdef uint64_t[::1] out0 = fps_out
    cdef int64_t[::1] outd = docs_out
    cdef uint64_t[::1] out1 = rot1_out
    cdef uint64_t[::1] out2 = rot2_out
    cdef uint64_t[::1] out3 = rot3_out
    if (out0.shape[0] != total or outd.shape[0] != total or out1.shape[0] != total
            or out2.shape[0] != total or out3.shape[0] != total):
        raise ValueError(f"output buffers must hold {total} elements")
    if total == 0:
        return 0
    cdef uint64_t* outs[4]
    outs[0] = &out0[0]
    outs[1] = &out1[0]
    outs[2] = &out2[0]
    outs[3] = &out3[0]
    for t in range(_BLOCKS):
        for i in range(m):
            r = runs[i]
            src[i] = r._tab[t]
            dsrc[i] = r._doc
            lens[i] = r.n
        with nogil:
            cd_kmerge(m, src, dsrc, lens, outs[t], &outd[0] if t == 0 else NULL)
    return total


def bucket_offsets(table):
    """The bucket directory of one sorted table: 65537 offsets (first index with top 16 bits >= b)."""
    return _bucket_offsets(np.asarray(table))
