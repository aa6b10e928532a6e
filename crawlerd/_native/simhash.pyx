"""64-bit simhash of page text and the block-table kernels of the near-duplicate index.

Fingerprint (Charikar 2002; Manku, Jain, Das Sarma, WWW 2007 §2):

1. Words: ``text.lower()``, then every maximal run of code points ``c`` with
   ``c.isalnum()`` (the regex ``[^\\W_]+``), so "Don't" gives "don", "t".
2. Features: 3-word shingles, the words joined by one space and UTF-8 encoded.
   One or two words give a single shingle of all of them; no words give 0.
3. Each shingle occurrence is hashed with ``shingle_hash`` (below) and votes
   +1 on the bits set in its hash and -1 on the others; a shingle that occurs
   w times thus weighs w. Bit b of the simhash is 1 iff its vote is > 0.

``shingle_hash`` is a murmur3-style 64-bit hash of our own: h = n * 0x9E3779B97F4A7C15;
per 8-byte little-endian block k (the last one zero-padded): k *= C1, k = rotl(k, 31),
k *= C2, h ^= k, h = rotl(h, 27), h = h * 5 + 0x52dce729; finally the murmur3 fmix64.
The pure-Python reference (``simhash_ref``) computes the same values bit for bit.

Votes are counted eight bits at a time: each hash byte indexes a table that
spreads its 8 bits into the 8 byte-lanes of a uint64, so a shingle costs 8 adds
instead of 64; lanes are flushed to wide counters before they can overflow.

The index kernels (``BlockTables``, ``scan_into``, ``merge_tables``) serve
``crawlerd.dedup.simhash_index``; see there for the layout.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

import numpy as np

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    unsigned int PyUnicode_KIND(object o)
    const void* PyUnicode_DATA(object o)
    # A pure function of the code point (Unicode database lookup): safe without the GIL.
    bint cd_isalnum "Py_UNICODE_ISALNUM"(uint32_t ch) nogil

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>

    static inline uint64_t cd_rotl64(uint64_t x, int r) {
        return r == 0 ? x : (x << r) | (x >> (64 - r));
    }

    static inline uint64_t cd_load_le64(const unsigned char *p) {
        uint64_t v;
        memcpy(&v, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }

    static inline uint64_t cd_round(uint64_t h, uint64_t k) {
        k *= 0x87c37b91114253d5ULL;
        k = cd_rotl64(k, 31);
        k *= 0x4cf5ad432745937fULL;
        h ^= k;
        h = cd_rotl64(h, 27);
        return h * 5 + 0x52dce729ULL;
    }

    static inline uint64_t cd_fmix64(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        k *= 0xc4ceb9fe1a85ec53ULL;
        k ^= k >> 33;
        return k;
    }

    /* The caller guarantees 8 readable bytes at p + (n & ~7): the last block is
       loaded whole and masked, which avoids a byte loop per shingle. */
    static inline uint64_t cd_shingle_hash_padded(const unsigned char *p, Py_ssize_t n) {
        uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ULL;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) h = cd_round(h, cd_load_le64(p + i));
        Py_ssize_t rem = n - i;
        if (rem) h = cd_round(h, cd_load_le64(p + i) & ((1ULL << (8 * rem)) - 1));
        return cd_fmix64(h);
    }

    static inline uint64_t cd_shingle_hash(const unsigned char *p, Py_ssize_t n) {
        uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ULL;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) h = cd_round(h, cd_load_le64(p + i));
        Py_ssize_t rem = n - i;
        if (rem) {
            unsigned char last[8] = {0};
            memcpy(last, p + i, (size_t)rem);
            h = cd_round(h, cd_load_le64(last));
        }
        return cd_fmix64(h);
    }

    /* Frequency-weighted bit votes over the shingles of the stream buf[0:n]
       ("w1 w2 ...", word i starting at starts[i]). Counted in 8-bit lanes:
       spread[b] puts bit m of byte b into byte m of a uint64, so one add counts
       8 bits; after at most 255 votes the lanes are flushed to wide totals.
       Runs after tokenizing: hashing bytes right after writing them one by one
       would stall on store-to-load forwarding of the 8-byte block loads. */
    static uint64_t cd_vote_shingles(const unsigned char *buf, Py_ssize_t n, const int32_t *starts,
                                     Py_ssize_t words, const uint64_t *spread) {
        if (words == 0) return 0;
        int64_t total[64] = {0};
        Py_ssize_t nsh = words < 3 ? 1 : words - 2;
        for (Py_ssize_t base = 0; base < nsh; base += 255) {
            Py_ssize_t stop = nsh - base < 255 ? nsh : base + 255;
            uint64_t lane[8] = {0};
            for (Py_ssize_t i = base; i < stop; i++) {
                Py_ssize_t s = 0, e = n;
                if (words >= 3) {
                    s = starts[i];
                    e = i + 3 < words ? starts[i + 3] - 1 : n;
                }
                uint64_t h = cd_shingle_hash_padded(buf + s, e - s);
                for (int j = 0; j < 8; j++) lane[j] += spread[(h >> (8 * j)) & 0xFF];
            }
            for (int j = 0; j < 8; j++)
                for (int m = 0; m < 8; m++) total[8 * j + m] += (lane[j] >> (8 * m)) & 0xFF;
        }
        uint64_t out = 0;
        for (int b = 0; b < 64; b++)
            if (2 * total[b] > nsh) out |= (uint64_t)1 << b;  /* vote = ones - zeros > 0 */
        return out;
    }

    /* The ASCII special case of _tokenize: table[c] is the lowercase of c if c is
       alphanumeric, else 0. Branch-free: word boundaries are irregular, and a
       mispredicted branch per boundary costs more than a few extra stores. A
       non-word byte is written as a space and kept only right after a word, so
       each gap collapses to one separator; starts[words] is written speculatively
       and only kept when a word begins there. */
    static Py_ssize_t cd_tokenize_ascii(const unsigned char *s, Py_ssize_t len, const unsigned char *table,
                                        unsigned char *buf, int32_t *starts, Py_ssize_t *nbytes) {
        Py_ssize_t n = 0, words = 0;
        unsigned prev = 0;
        for (Py_ssize_t i = 0; i < len; i++) {
            unsigned a = table[s[i]];
            unsigned w = a != 0;
            buf[n] = (unsigned char)(a | ((w ^ 1u) << 5));
            starts[words] = (int32_t)n;
            words += w & (prev ^ 1u);
            n += w | prev;
            prev = w;
        }
        if (!prev && n > 0) n--;
        *nbytes = n;
        return words;
    }

    /* popcount(d) <= k for small k: clear the lowest set bit k times. */
    static inline int cd_within(uint64_t d, int k) {
        for (int j = 0; j < k; j++) d &= d - 1;
        return d == 0;
    }

    static inline int cd_popcount64(uint64_t x) {
        x = x - ((x >> 1) & 0x5555555555555555ULL);
        x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
        x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
        return (int)((x * 0x0101010101010101ULL) >> 56);
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
    """
    uint64_t cd_rotl64(uint64_t x, int r) nogil
    uint64_t cd_shingle_hash_padded(const unsigned char *p, Py_ssize_t n) nogil
    uint64_t cd_shingle_hash(const unsigned char *p, Py_ssize_t n) nogil
    uint64_t cd_vote_shingles(const unsigned char *buf, Py_ssize_t n, const int32_t *starts,
                              Py_ssize_t words, const uint64_t *spread) nogil
    int cd_within(uint64_t d, int k) nogil
    Py_ssize_t cd_tokenize_ascii(const unsigned char *s, Py_ssize_t len, const unsigned char *table,
                                 unsigned char *buf, int32_t *starts, Py_ssize_t *nbytes) nogil
    int cd_popcount64(uint64_t x) nogil
    Py_ssize_t cd_lower_bound(const uint64_t *a, Py_ssize_t n, uint64_t key) nogil


# _SPREAD[b]: byte lane m of the result holds bit m of b (0 or 1).
cdef uint64_t _SPREAD[256]
# _ASCII_WORD[c]: the lowercase of ASCII c if c is alphanumeric, else 0 (0 above 127).
cdef uint8_t _ASCII_WORD[256]
# _LATIN1_ALNUM[c]: str.isalnum() of U+0000..U+00FF (saves a database lookup per Latin-1 letter).
cdef uint8_t _LATIN1_ALNUM[256]


cdef void _init_tables() noexcept:
    cdef int b, m
    for b in range(256):
        _SPREAD[b] = 0
        for m in range(8):
            if (b >> m) & 1:
                _SPREAD[b] |= (<uint64_t>1) << (8 * m)
    for b in range(256):
        _ASCII_WORD[b] = 0
        if 48 <= b <= 57 or 97 <= b <= 122:
            _ASCII_WORD[b] = b
        elif 65 <= b <= 90:
            _ASCII_WORD[b] = b + 32
    for b in range(256):
        _LATIN1_ALNUM[b] = cd_isalnum(b)


_init_tables()


cdef inline Py_ssize_t _put_utf8(unsigned char* out, uint32_t c) noexcept nogil:
    if c < 0x80:
        out[0] = <unsigned char>c
        return 1
    if c < 0x800:
        out[0] = <unsigned char>(0xC0 | (c >> 6))
        out[1] = <unsigned char>(0x80 | (c & 0x3F))
        return 2
    if c < 0x10000:
        out[0] = <unsigned char>(0xE0 | (c >> 12))
        out[1] = <unsigned char>(0x80 | ((c >> 6) & 0x3F))
        out[2] = <unsigned char>(0x80 | (c & 0x3F))
        return 3
    out[0] = <unsigned char>(0xF0 | (c >> 18))
    out[1] = <unsigned char>(0x80 | ((c >> 12) & 0x3F))
    out[2] = <unsigned char>(0x80 | ((c >> 6) & 0x3F))
    out[3] = <unsigned char>(0x80 | (c & 0x3F))
    return 4


ctypedef fused uchar_t:
    uint8_t
    uint16_t
    uint32_t


cdef Py_ssize_t _tokenize(const uchar_t* s, Py_ssize_t length, unsigned char* buf, int32_t* starts,
                          Py_ssize_t* nbytes) noexcept nogil:
    """Write the words of s to buf as "w1 w2 ..." (UTF-8), their offsets to starts; return the count.

    s is already lowercased except for ASCII letters, which the table folds.
    starts needs room for words + 1 entries (one speculative write per character).
    """
    cdef Py_ssize_t i, n = 0, words = 0
    cdef bint prev = False, w
    cdef uint32_t c
    cdef uint8_t a
    for i in range(length):
        c = s[i]
        if c < 128:
            # the same branch-free step as cd_tokenize_ascii
            a = _ASCII_WORD[c]
            w = a != 0
            buf[n] = a if w else 32
            starts[words] = <int32_t>n
            words += w and not prev
            n += w or prev
            prev = w
        elif (_LATIN1_ALNUM[c] != 0) if c < 256 else cd_isalnum(c):
            if not prev:
                starts[words] = <int32_t>n
                words += 1
            n += _put_utf8(buf + n, c)
            prev = True
        else:
            if prev:
                buf[n] = 32
                n += 1
            prev = False
    if not prev and n > 0:
        n -= 1  # drop the separator after the last word
    nbytes[0] = n
    return words


def simhash(str text not None):
    """64-bit simhash of ``text`` over 3-word shingles (see the module docstring)."""
    cdef str t = text if PyUnicode_IS_ASCII(text) else text.lower()  # ASCII: the table folds case
    cdef unsigned int kind = PyUnicode_KIND(t)
    cdef Py_ssize_t length = len(t)
    # UTF-8 bytes per code point: 1 for ASCII, <= 2 below U+0100, <= 3 below U+10000, else 4.
    cdef Py_ssize_t per_char = 1 if PyUnicode_IS_ASCII(t) else (kind + 1 if kind < 4 else 4)
    # The stream "w1 w2 w3 ..." is built once; a shingle is the slice from the start of
    # its first word to the end of its third. 16 bytes of slack for the padded block loads.
    cdef const void* data = PyUnicode_DATA(t)
    cdef Py_ssize_t n = 0, words = 0
    cdef uint64_t result
    if length >= (1 << 29):  # byte offsets are int32
        raise ValueError("text longer than 2**29 code points")
    cdef unsigned char* buf = <unsigned char*>malloc(per_char * length + 16)
    cdef int32_t* starts = <int32_t*>malloc((length // 2 + 2) * sizeof(int32_t))
    if buf == NULL or starts == NULL:
        free(buf)
        free(starts)
        raise MemoryError()
    with nogil:
        if per_char == 1:
            words = cd_tokenize_ascii(<const unsigned char*>data, length, _ASCII_WORD, buf, starts, &n)
        elif kind == 1:
            words = _tokenize(<const uint8_t*>data, length, buf, starts, &n)
        elif kind == 2:
            words = _tokenize(<const uint16_t*>data, length, buf, starts, &n)
        else:
            words = _tokenize(<const uint32_t*>data, length, buf, starts, &n)
        result = cd_vote_shingles(buf, n, starts, words, _SPREAD)
    free(buf)
    free(starts)
    return result


def shingle_hash(const unsigned char[::1] data):
    """The 64-bit hash a shingle's UTF-8 bytes vote with."""
    if data.shape[0] == 0:
        return cd_shingle_hash(NULL, 0)
    return cd_shingle_hash(&data[0], data.shape[0])


def hamming(uint64_t a, uint64_t b):
    """Number of differing bits of two 64-bit fingerprints (OverflowError outside [0, 2**64))."""
    return cd_popcount64(a ^ b)


# -- near-duplicate index kernels ---------------------------------------------

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
        cdef int t, tt, dist
        cdef int found = 0
        cdef Py_ssize_t lo, hi, i, j
        cdef uint64_t qr, x, prev, fp, d
        cdef const uint64_t* tab
        cdef bint seen_before, have_prev
        if k < 0 or k > 3:
            raise ValueError("k must be in 0..3")
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


def scan_into(const uint64_t[::1] fps, const int64_t[::1] doc_ids, Py_ssize_t n, uint64_t q, int k,
              list out):
    """Append (doc_id, fp, distance) for each of the first n unsorted pairs within k bits of q."""
    cdef Py_ssize_t i
    cdef int found = 0
    if k < 0 or k > 3:
        raise ValueError("k must be in 0..3")
    if n > fps.shape[0] or n > doc_ids.shape[0] or n < 0:
        raise ValueError("n exceeds the arrays")
    for i in range(n):
        if cd_within(fps[i] ^ q, k):
            out.append((doc_ids[i], fps[i], cd_popcount64(fps[i] ^ q)))
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
